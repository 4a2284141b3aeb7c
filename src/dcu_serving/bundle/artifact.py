"""One artifact of a bundle as the builder handles it; index.json holds it as a mapping (dcu_serving.bundle.index)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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


def read_artifacts(bundle) -> list[Artifact]:
    """The artifacts of a bundle's index.json (BundleIndexError when it cannot be read)."""
    from dcu_serving.bundle.index import read_index

    return [Artifact.from_json(item) for item in read_index(bundle)["artifacts"]]


def write_artifacts(bundle, artifacts: list[Artifact]) -> bool:
    """index.json and SHA256SUMS of the artifacts, byte-stable; True when either changed."""
    from dcu_serving import __version__
    from dcu_serving.bundle.index import write_index

    return write_index(bundle, [a.to_json() for a in artifacts], {"tool": "dcu-bundle", "version": __version__})
