# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""SHA-256 of bundle artifacts with a cache keyed on (path, size, mtime).

Bundle artifacts reach tens of GB (image tarballs); hashing them on every run would make a re-run
read them all again. A file whose size and modification time (ns) did not change since it was
hashed keeps its cached sum. The cache is one JSON file, updated under an exclusive lock and replaced
atomically, so parallel runs neither corrupt it nor block readers.

The same file is the `dcu_serving.bundle.checksum` module of the Python package (a symlink there), so
the bundle builder on the controller and the roles on the hosts share one cache format and one
implementation. Standard library only: it runs with a target's bare python3.
"""

import errno
import fcntl
import hashlib
import json
import os
import tempfile

CHUNK = 4 * 1024 * 1024


def default_cache_path():
    """System-wide for root, per user otherwise (a controller runs unprivileged)."""
    if os.geteuid() == 0:
        return "/var/cache/dcu-serving/sha256-cache.json"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dcu-serving", "sha256-cache.json")


def sha256_file(path, progress=None):
    """Hex SHA-256 of a file; progress(n) is called with each block's size."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
            if progress:
                progress(len(block))
    return digest.hexdigest()


def _load(cache_path):
    try:
        with open(cache_path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_json_store(path, change, prefix):
    """Replace the JSON mapping at `path` with change(its data) under an exclusive lock (`path`.lock), written
    through a temporary file (mode 0644, `prefix` names it), so concurrent writers and readers never see half of
    it. A missing or unreadable store counts as {}. OSError (not writable) is the caller's."""
    path = os.fspath(path)
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = change(_load(path))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)


class ChecksumCache:
    """cached_sha256(path) -> (sha256, from_cache). `cache_path=None` disables the cache."""

    def __init__(self, cache_path=None, write=True):
        self.cache_path = cache_path
        self.write = write
        self.warnings = []

    def cached_sha256(self, path, progress=None):
        real = os.path.realpath(path)
        stat = os.stat(real)
        key = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        if self.cache_path:
            entry = _load(self.cache_path).get(real)
            if isinstance(entry, dict) and all(entry.get(k) == v for k, v in key.items()) \
                    and entry.get("sha256"):
                return entry["sha256"], True
        digest = sha256_file(real, progress)
        # A file that changed while it was read gets no cache entry: its sum may be of neither version.
        after = os.stat(real)
        if self.cache_path and self.write and (after.st_size, after.st_mtime_ns) == (stat.st_size, stat.st_mtime_ns):
            self._store(real, dict(key, sha256=digest))
        return digest, False

    def sha256(self, path, progress=None):
        return self.cached_sha256(path, progress)[0]

    def remember(self, path, digest):
        """Record the sum of a file this process just wrote (its bytes were hashed while writing)."""
        if self.cache_path and self.write:
            real = os.path.realpath(path)
            stat = os.stat(real)
            self._store(real, {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest})

    def _store(self, real, entry):
        def change(data):
            # Forget entries of files that no longer exist so the cache does not grow forever.
            data = {p: e for p, e in data.items() if os.path.exists(p)}
            data[real] = entry
            return data

        try:
            update_json_store(self.cache_path, change, ".sha256-cache.")
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise
            self.warnings.append("checksum cache {} not writable ({}); sums are not cached".format(
                self.cache_path, exc.strerror))


def verify(path, expected, cache=None):
    """Compare a file with its expected SHA-256.

    Returns a dict: status (verified | missing | mismatch), path, expected, actual (None when missing),
    size, cached (the sum came from the cache).
    """
    expected = expected.lower()
    result = {"path": path, "expected": expected, "actual": None, "size": None, "cached": False}
    try:
        result["size"] = os.stat(path).st_size
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return dict(result, status="missing")
        raise
    actual, cached = (cache or ChecksumCache(None)).cached_sha256(path)
    status = "verified" if actual == expected else "mismatch"
    return dict(result, status=status, actual=actual, cached=cached)
