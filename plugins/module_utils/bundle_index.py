# Copyright: dcu-serving contributors
# Apache License 2.0 (see the collection's LICENSE)
"""An offline bundle's index.json and SHA256SUMS: the format, reading and writing them byte-stable, and verifying a
whole bundle - every problem, not just the first, each one of missing | size | mismatch | unlisted | sums | index.

The one place the bundle's format is defined (FORMAT, KINDS, the transient suffixes) and checked: the collection's
bundle_verify module and `dcu-bundle build|verify|list` (src/dcu_serving/bundle/index.py is a symlink to this file)
both use it. Standard library only, Python 3.6+: a user with only the collection tarball stages a bundle with
playbooks/stage.yml, and a host's own python3 runs the module."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

FORMAT = 1
INDEX = "index.json"
SUMS = "SHA256SUMS"
# Artifact kinds and the bundle subdirectory each lives in.
KINDS = {
    "driver": "driver",
    "dtk": "dtk",
    "hyhal": "hyhal",
    "deb": "debs",
    "image": "images",
    "wheel": "wheels",
    "collection": "collections",
}
REQUIRED = ("name", "kind", "version", "file", "sha256", "size")
# Files a build leaves only while it runs (an artifact arriving, index.json being rewritten); never part of a
# finished bundle.
PART_SUFFIX = ".part"
TMP_SUFFIX = ".tmp"
TRANSIENT_SUFFIXES = (PART_SUFFIX, TMP_SUFFIX)


class BundleIndexError(ValueError):
    """index.json cannot be read or does not follow format 1."""


def read_index(bundle):
    """The parsed index.json of a bundle directory: {"format": 1, "artifacts": [...], ...}."""
    path = os.path.join(str(bundle), INDEX)
    try:
        with open(path) as handle:
            doc = json.load(handle)
    except (OSError, IOError) as exc:
        if not os.path.exists(path):
            raise BundleIndexError("{}: missing — not a bundle (build one with `dcu-bundle build` or "
                                   "playbooks/bundle.yml)".format(path)) from None
        raise BundleIndexError("{}: cannot be read ({})".format(path, exc)) from None
    except ValueError as exc:
        raise BundleIndexError("{}: not valid JSON ({})".format(path, exc)) from None
    problem = index_problem(doc, path)
    if problem:
        raise BundleIndexError(problem)
    return doc


def file_problem(file, kind):
    """Why `file` cannot be the path of an artifact of `kind` inside a bundle, or '' when it can.

    An artifact's file is joined to the bundle directory on the controller and to the staging directory on a host,
    where root writes it: it must stay inside, in its kind's directory (`wheels/x.whl`), so that no index entry
    reaches /etc or ../../root/.ssh, nor takes the place of index.json, SHA256SUMS or a transfer's scratch.
    """
    if not isinstance(file, str) or not file:
        return "is not a path"
    if file.startswith("/"):
        return "is an absolute path; give it relative to the bundle ({}/<name>)".format(KINDS.get(kind, "<kind>"))
    if any(ord(c) < 32 or c in "\\\x7f" for c in file):
        return "holds a control character or a backslash"
    parts = file.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "is not a plain path (an empty, . or .. part)"
    if kind in KINDS and (len(parts) < 2 or parts[0] != KINDS[kind]):
        return "is not in {}/, the directory of kind {}".format(KINDS[kind], kind)
    return ""


def index_problem(doc, where=INDEX):
    """Why a parsed index.json does not follow the format (naming `where`), or '' when it does."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("artifacts"), list):
        return '{}: expected {{"format": {}, "artifacts": [...]}}'.format(where, FORMAT)
    for i, item in enumerate(doc["artifacts"]):
        if not isinstance(item, dict):
            return "{}: artifacts[{}] is not an object".format(where, i)
        missing = [k for k in REQUIRED if k not in item]
        if missing:
            return "{}: artifacts[{}] lacks {}".format(where, i, ", ".join(missing))
        if item["kind"] not in KINDS:
            return "{}: artifacts[{}].kind {!r} is not one of {}".format(where, i, item["kind"], ", ".join(KINDS))
        problem = file_problem(item["file"], item["kind"])
        if problem:
            return "{}: artifacts[{}].file {!r} {}".format(where, i, item["file"], problem)
    return ""


def read_sums(bundle):
    """SHA256SUMS as {file: sha256}; None when the file is missing."""
    path = os.path.join(str(bundle), SUMS)
    try:
        with open(path) as handle:
            text = handle.read()
    except (OSError, IOError):
        if not os.path.exists(path):
            return None
        raise
    sums = {}
    for line in text.splitlines():
        digest, name = line.partition("  ")[::2]
        if name:
            sums[name.lstrip("*")] = digest
    return sums


def render_index(artifacts, builder):
    """index.json's text: the artifacts (dicts, as index.json holds them) sorted by file, and who built it."""
    doc = {"format": FORMAT, "builder": builder, "artifacts": sorted(artifacts, key=lambda a: a["file"])}
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def render_sums(artifacts):
    """SHA256SUMS' text, `sha256sum -c` compatible, sorted by file."""
    return "".join("{}  {}\n".format(a["sha256"], a["file"]) for a in sorted(artifacts, key=lambda a: a["file"]))


def write_if_changed(path, text):
    """Write path through a temporary file (a reader never sees half of it) unless it holds text already."""
    path = str(path)
    if os.path.isfile(path):
        with open(path) as handle:
            if handle.read() == text:
                return False
    tmp = path + TMP_SUFFIX
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)
    return True


def write_index(bundle, artifacts, builder):
    """Write index.json and SHA256SUMS; True when either changed."""
    changed = write_if_changed(os.path.join(str(bundle), INDEX), render_index(artifacts, builder))
    return write_if_changed(os.path.join(str(bundle), SUMS), render_sums(artifacts)) or changed


def _problem(file, problem, detail):
    return {"file": file, "problem": problem, "detail": detail}


def describe(problem):
    """One problem as a line: `mismatch  images/vllm.tar: expected sha256 ..., actual ...`."""
    return "{:<9} {}: {}".format(problem["problem"], problem["file"], problem["detail"])


def verify(bundle, cache):
    """Check a bundle directory. Returns (index or None, problems).

    cache: an object with sha256(path) (module_utils.checksum.ChecksumCache). Every listed file must be
    present with its size and SHA-256, SHA256SUMS must agree with index.json, and no other file may be there.
    """
    bundle = str(bundle)
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
