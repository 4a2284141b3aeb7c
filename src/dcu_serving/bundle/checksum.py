"""SHA-256 of (possibly huge) files, cached by (path, size, mtime).

The cache file and its format are the ones the collection's `bundle_artifact` module uses
(plugins/module_utils/checksum.py: `{realpath: {size, mtime_ns, sha256}}`), so a controller that
built or verified a bundle does not re-read a 20 GB image tarball for the roles, and vice versa.
The module must stay importable on hosts without this package, hence two small implementations.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from pathlib import Path

CHUNK = 4 * 1024 * 1024


def default_cache_path() -> Path:
    if os.geteuid() == 0:
        return Path("/var/cache/dcu-serving/sha256-cache.json")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "dcu-serving", "sha256-cache.json")


def sha256_file(path: Path, progress=None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
            if progress:
                progress(len(block))
    return digest.hexdigest()


class ChecksumCache:
    """`sha256(path)`; a file whose size and mtime did not change keeps its cached sum.

    `path=None` disables the cache (every call reads the file).
    """

    def __init__(self, path: Path | None = None):
        self.path = path
        self._data: dict | None = None

    def _load(self) -> dict:
        if self._data is None:
            try:
                data = json.loads(self.path.read_text()) if self.path else {}
            except (OSError, ValueError):
                data = {}
            self._data = data if isinstance(data, dict) else {}
        return self._data

    def sha256(self, path: Path, progress=None) -> str:
        real = os.path.realpath(path)
        st = os.stat(real)
        entry = self._load().get(real)
        if isinstance(entry, dict) and entry.get("size") == st.st_size \
                and entry.get("mtime_ns") == st.st_mtime_ns and entry.get("sha256"):
            return entry["sha256"]
        digest = sha256_file(Path(real), progress)
        after = os.stat(real)
        if (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns):
            self.remember(Path(real), digest)
        return digest

    def remember(self, path: Path, digest: str) -> None:
        """Record the sum of a file this process just wrote (its bytes were hashed while writing)."""
        if not self.path:
            return
        real = os.path.realpath(path)
        st = os.stat(real)
        entry = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
        self._load()[real] = entry
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(str(self.path) + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    on_disk = json.loads(self.path.read_text())
                except (OSError, ValueError):
                    on_disk = {}
                on_disk = {p: e for p, e in on_disk.items() if os.path.exists(p)} if isinstance(on_disk, dict) else {}
                on_disk[real] = entry
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".sha256-cache.")
                with os.fdopen(fd, "w") as f:
                    json.dump(on_disk, f, indent=1, sort_keys=True)
                os.chmod(tmp, 0o644)
                os.replace(tmp, self.path)
        except PermissionError:
            pass  # a read-only cache only costs time
