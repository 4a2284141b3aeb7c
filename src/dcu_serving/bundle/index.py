"""index.json and SHA256SUMS: reading and writing them, byte-stable."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dcu_serving import __version__
from dcu_serving.bundle import FORMAT, INDEX, KINDS, SUMS


@dataclass
class Artifact:
    """One file of the bundle. `file` is relative to the bundle root."""

    name: str
    kind: str
    version: str
    file: str
    sha256: str
    size: int
    source: str = ""
    extra: dict = field(default_factory=dict)  # images: refs, config_digest; wheels: resolved_by

    def to_json(self) -> dict:
        data = asdict(self)
        data.update(data.pop("extra"))
        return data

    @classmethod
    def from_json(cls, data: dict) -> Artifact:
        known = {k: data[k] for k in ("name", "kind", "version", "file", "sha256", "size", "source") if k in data}
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**known, extra=extra)


class BundleIndexError(ValueError):
    """index.json cannot be read or does not follow format 1."""


def render_index(artifacts: list[Artifact]) -> str:
    doc = {
        "format": FORMAT,
        "builder": {"tool": "dcu-bundle", "version": __version__},
        "artifacts": [a.to_json() for a in sorted(artifacts, key=lambda a: a.file)],
    }
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def render_sums(artifacts: list[Artifact]) -> str:
    return "".join(f"{a.sha256}  {a.file}\n" for a in sorted(artifacts, key=lambda a: a.file))


def read_index(bundle: Path) -> list[Artifact]:
    path = bundle / INDEX
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BundleIndexError(f"{path}: missing — not a bundle (build one with `dcu-bundle build`)") from None
    except ValueError as e:
        raise BundleIndexError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("artifacts"), list):
        raise BundleIndexError(f'{path}: expected {{"format": {FORMAT}, "artifacts": [...]}}')
    artifacts = []
    for i, item in enumerate(doc["artifacts"]):
        missing = [k for k in ("name", "kind", "version", "file", "sha256", "size") if k not in item]
        if missing:
            raise BundleIndexError(f"{path}: artifacts[{i}] lacks {', '.join(missing)}")
        if item["kind"] not in KINDS:
            raise BundleIndexError(f"{path}: artifacts[{i}].kind {item['kind']!r} is not one of {', '.join(KINDS)}")
        artifacts.append(Artifact.from_json(item))
    return artifacts


def read_sums(bundle: Path) -> dict[str, str] | None:
    try:
        text = (bundle / SUMS).read_text()
    except FileNotFoundError:
        return None
    sums = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        if name:
            sums[name.lstrip("*")] = digest
    return sums


def write_if_changed(path: Path, text: str) -> bool:
    if path.is_file() and path.read_text() == text:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True


def write_index(bundle: Path, artifacts: list[Artifact]) -> bool:
    """Write index.json and SHA256SUMS; True when either changed."""
    changed = write_if_changed(bundle / INDEX, render_index(artifacts))
    return write_if_changed(bundle / SUMS, render_sums(artifacts)) or changed
