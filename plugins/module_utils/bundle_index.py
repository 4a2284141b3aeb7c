# Copyright: dcu-serving contributors
# Apache License 2.0 (see the collection's LICENSE)
"""Read an offline bundle's index.json and SHA256SUMS and verify the whole bundle, as `dcu-bundle verify` does.

The collection needs this without the dcu-serving Python package (a user with only the collection tarball
stages a bundle with playbooks/stage.yml), so it lives here, standard library only, in the same terms as
dcu_serving.bundle.verify: every problem, not just the first, each one of missing | size | mismatch |
unlisted | sums | index.
"""

import json
import os

FORMAT = 1
INDEX = "index.json"
SUMS = "SHA256SUMS"
KINDS = ("driver", "dtk", "hyhal", "deb", "image", "wheel", "collection")
REQUIRED = ("name", "kind", "version", "file", "sha256", "size")
# Files a build leaves only while it runs; never part of a finished bundle.
TRANSIENT_SUFFIXES = (".part", ".tmp")


class BundleIndexError(ValueError):
    """index.json cannot be read or does not follow format 1."""


def read_index(bundle):
    """The parsed index.json of a bundle directory: {"format": 1, "artifacts": [...], ...}."""
    path = os.path.join(bundle, INDEX)
    try:
        with open(path) as handle:
            doc = json.load(handle)
    except (OSError, IOError) as exc:
        if not os.path.exists(path):
            raise BundleIndexError("{}: missing — not a bundle".format(path)) from None
        raise BundleIndexError("{}: cannot be read ({})".format(path, exc)) from None
    except ValueError as exc:
        raise BundleIndexError("{}: not valid JSON ({})".format(path, exc)) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("artifacts"), list):
        raise BundleIndexError('{}: expected {{"format": {}, "artifacts": [...]}}'.format(path, FORMAT))
    for i, item in enumerate(doc["artifacts"]):
        if not isinstance(item, dict):
            raise BundleIndexError("{}: artifacts[{}] is not an object".format(path, i))
        missing = [k for k in REQUIRED if k not in item]
        if missing:
            raise BundleIndexError("{}: artifacts[{}] lacks {}".format(path, i, ", ".join(missing)))
        if item["kind"] not in KINDS:
            raise BundleIndexError("{}: artifacts[{}].kind {!r} is not one of {}".format(
                path, i, item["kind"], ", ".join(KINDS)))
    return doc


def read_sums(bundle):
    """SHA256SUMS as {file: sha256}; None when the file is missing."""
    try:
        with open(os.path.join(bundle, SUMS)) as handle:
            text = handle.read()
    except (OSError, IOError):
        if not os.path.exists(os.path.join(bundle, SUMS)):
            return None
        raise
    sums = {}
    for line in text.splitlines():
        digest, name = line.partition("  ")[::2]
        if name:
            sums[name.lstrip("*")] = digest
    return sums


def _problem(file, problem, detail):
    return {"file": file, "problem": problem, "detail": detail}


def verify(bundle, cache):
    """Check a bundle directory. Returns (index or None, problems).

    cache: an object with sha256(path) (module_utils.checksum.ChecksumCache). Every listed file must be
    present with its size and SHA-256, SHA256SUMS must agree with index.json, and no other file may be there.
    """
    try:
        index = read_index(bundle)
    except BundleIndexError as exc:
        return None, [_problem(INDEX, "index", str(exc))]
    problems = []
    artifacts = index["artifacts"]
    for a in artifacts:
        path = os.path.join(bundle, a["file"])
        if not os.path.isfile(path):
            problems.append(_problem(a["file"], "missing", "listed in {} ({} {} {}) but absent".format(
                INDEX, a["kind"], a["name"], a["version"])))
            continue
        size = os.stat(path).st_size
        if size != a["size"]:
            problems.append(_problem(a["file"], "size", "expected {} bytes, found {}".format(a["size"], size)))
            continue
        actual = cache.sha256(path)
        if actual != a["sha256"]:
            problems.append(_problem(a["file"], "mismatch", "expected sha256 {}, actual {}".format(
                a["sha256"], actual)))

    sums = read_sums(bundle)
    listed = dict((a["file"], a["sha256"]) for a in artifacts)
    if sums is None:
        problems.append(_problem(SUMS, "sums", "missing"))
    elif sums != listed:
        for name in sorted(set(sums) | set(listed)):
            if sums.get(name) != listed.get(name):
                problems.append(_problem(name, "sums", "{} says {}, {} says {}".format(
                    SUMS, sums.get(name) or "nothing", INDEX, listed.get(name) or "nothing")))

    present = []
    for root, dirs, files in os.walk(bundle):  # a link to a directory is a file here, not followed
        present.extend(os.path.relpath(os.path.join(root, name), bundle).replace(os.sep, "/")
                       for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))])
    for rel in sorted(present):
        if rel in (INDEX, SUMS) or rel in listed:
            continue
        what = "left by an interrupted build" if rel.endswith(TRANSIENT_SUFFIXES) else "not listed in {}".format(INDEX)
        problems.append(_problem(rel, "unlisted", what))
    return index, problems
