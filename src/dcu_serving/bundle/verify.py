"""Offline verification of a bundle: every problem, not just the first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dcu_serving.bundle import INDEX, SUMS
from dcu_serving.bundle.checksum import ChecksumCache
from dcu_serving.bundle.index import BundleIndexError, read_index, read_sums

# Files a build leaves only while it runs; never part of a finished bundle.
TRANSIENT_SUFFIXES = (".part", ".tmp")


@dataclass(frozen=True)
class Problem:
    file: str
    problem: str  # missing | mismatch | size | unlisted | sums | index
    detail: str

    def __str__(self) -> str:
        return f"{self.problem:<9} {self.file}: {self.detail}"


def verify(bundle: Path, cache: ChecksumCache | None = None) -> list[Problem]:
    """Check that every listed file is present with its size and SHA-256, that SHA256SUMS agrees with
    index.json, and that no file is there that the index does not list."""
    cache = cache or ChecksumCache(None)
    try:
        artifacts = read_index(bundle)
    except BundleIndexError as e:
        return [Problem(INDEX, "index", str(e))]
    problems = []
    for a in artifacts:
        path = bundle / a.file
        if not path.is_file():
            problems.append(Problem(a.file, "missing", f"listed in {INDEX} ({a.kind} {a.name} {a.version}) but absent"))
            continue
        size = path.stat().st_size
        if size != a.size:
            problems.append(Problem(a.file, "size", f"expected {a.size} bytes, found {size}"))
            continue
        actual = cache.sha256(path)
        if actual != a.sha256:
            problems.append(Problem(a.file, "mismatch", f"expected sha256 {a.sha256}, actual {actual}"))

    sums = read_sums(bundle)
    listed = {a.file: a.sha256 for a in artifacts}
    if sums is None:
        problems.append(Problem(SUMS, "sums", "missing"))
    elif sums != listed:
        for name in sorted(set(sums) | set(listed)):
            if sums.get(name) != listed.get(name):
                problems.append(Problem(name, "sums", f"{SUMS} says {sums.get(name) or 'nothing'}, "
                                                      f"{INDEX} says {listed.get(name) or 'nothing'}"))

    for path in sorted(p for p in bundle.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(bundle).as_posix()
        if rel in (INDEX, SUMS) or rel in listed:
            continue
        what = "left by an interrupted build" if rel.endswith(TRANSIENT_SUFFIXES) else f"not listed in {INDEX}"
        problems.append(Problem(rel, "unlisted", what))
    return problems
