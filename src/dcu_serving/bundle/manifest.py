"""The bundle manifest: what a bundle must hold, declared in the inventory (`dcu_bundle_manifest`).

Every mistake is reported at once, each naming its field and the fix, before anything is fetched.
Schema (docs/bundle.md):

    files:        [{name, kind: driver|dtk|hyhal|deb, version, src: PATH|URL, sha256, file?}]
    images:       [{name, ref, version?, config_digest?, optional?}]
    wheels:       {python_version, platforms: [...], implementation?, abi?, requirements: [...],
                   local_projects?: [...], constraints?, no_deps?, hashed?: [requirements file, ...]}
    collection:   {path}                      # this collection, built with ansible-galaxy
    collections:  [namespace.name, ...]       # from the installed `ansible` package, with dependencies
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from dcu_serving.bundle import KINDS
from dcu_serving.bundle.index import file_problem

VAR = "dcu_bundle_manifest"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
FQCN = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+$")
FILE_KINDS = ("driver", "dtk", "hyhal", "deb")


class ManifestError(ValueError):
    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("the bundle manifest has {} problem(s):\n  - {}".format(len(errors), "\n  - ".join(errors)))


@dataclass
class FileSpec:
    name: str
    kind: str
    version: str
    src: str
    sha256: str
    file: str


@dataclass
class ImageSpec:
    name: str
    ref: str
    version: str
    file: str
    config_digest: str | None = None
    optional: bool = False


@dataclass
class WheelSpec:
    python_version: str
    platforms: list[str]
    requirements: list[str]
    implementation: str = "cp"
    abi: str | None = None
    local_projects: list[str] = field(default_factory=list)
    constraints: str | None = None
    no_deps: bool = False
    hashed: list[str] = field(default_factory=list)  # fully pinned requirements files, each line with its hashes


@dataclass
class Manifest:
    files: list[FileSpec] = field(default_factory=list)
    images: list[ImageSpec] = field(default_factory=list)
    wheels: WheelSpec | None = None
    collection: str | None = None
    collections: list[str] = field(default_factory=list)


def _text(d: dict, key: str, where: str, errors: list, required=True, hint="") -> str | None:
    value = d.get(key)
    if value is None or value == "":
        if required:
            errors.append(f"{where}.{key}: missing{' — ' + hint if hint else ''}")
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        errors.append(f"{where}.{key}: expected a string, got {type(value).__name__}")
        return None
    return value


def _list(d: dict, key: str, where: str, errors: list) -> list:
    value = d.get(key) or []
    if not isinstance(value, list):
        errors.append(f"{where}.{key}: expected a list, got {type(value).__name__}")
        return []
    return value


def image_file(ref: str) -> str:
    """images/<repository path with / as _>_<tag>.tar.gz — readable and unique per ref. Gzipped: a saved image is
    mostly Python and shared libraries, a third of its size compressed, so staging copies and hashes a third
    (docker load reads gzip as it is)."""
    return "images/" + re.sub(r"[^A-Za-z0-9._-]+", "_", ref) + ".tar.gz"


def _mappings(data: dict, key: str, errors: list):
    """(where, item) for each mapping in the manifest's list `key`; an error naming each item that is not one."""
    for i, item in enumerate(_list(data, key, VAR, errors)):
        where = f"{VAR}.{key}[{i}]"
        if isinstance(item, dict):
            yield where, item
        else:
            errors.append(f"{where}: expected a mapping")


def parse(data: dict) -> Manifest:
    if isinstance(data, dict) and VAR in data:
        data = data[VAR]
    if not isinstance(data, dict):
        raise ManifestError([f"{VAR}: expected a mapping with files, images, wheels, collection, collections"])
    errors: list[str] = []
    unknown = sorted(set(data) - {"files", "images", "wheels", "collection", "collections"})
    if unknown:
        errors.append(f"{VAR}: unknown key(s) {', '.join(unknown)} "
                      "(allowed: files, images, wheels, collection, collections)")
    m = Manifest()
    seen: dict[str, str] = {}

    def claim(file: str, where: str):
        if file in seen:
            errors.append(f"{where}: bundle file {file} is also produced by {seen[file]}")
        seen[file] = where

    for where, item in _mappings(data, "files", errors):
        name = _text(item, "name", where, errors)
        kind = _text(item, "kind", where, errors, hint=f"one of {', '.join(FILE_KINDS)}")
        version = _text(item, "version", where, errors)
        src = _text(item, "src", where, errors, hint="a path on this machine or an http(s)/file URL")
        digest = _text(item, "sha256", where, errors,
                       hint="every file artifact needs its SHA-256 (the vendor's published sum, or `sha256sum FILE`)")
        if kind and kind not in FILE_KINDS:
            errors.append(f"{where}.kind: {kind!r} is not a file kind; use one of {', '.join(FILE_KINDS)} "
                          "(images, wheels and collections have their own sections)")
            kind = None
        if digest and not SHA256.match(digest.lower()):
            errors.append(f"{where}.sha256: {digest!r} is not 64 hex digits")
            digest = None
        if None in (name, kind, version, src, digest):
            continue
        # A URL's name unquoted: Debian's pool quotes the '+' and '~' of versions (%2b, %7e).
        basename = unquote(src.rstrip("/").rsplit("/", 1)[-1]) if "://" in src else src.rstrip("/").rsplit("/", 1)[-1]
        file = _text(item, "file", where, errors, required=False) or f"{KINDS[kind]}/{basename}"
        problem = file_problem(file, kind)
        if problem:
            errors.append(f"{where}.file: {file!r} {problem}")
            continue
        claim(file, where)
        m.files.append(FileSpec(name, kind, version, src, digest.lower(), file))

    for where, item in _mappings(data, "images", errors):
        name = _text(item, "name", where, errors)
        ref = _text(item, "ref", where, errors, hint="the image reference, e.g. registry/vllm:0.11.0")
        digest = _text(item, "config_digest", where, errors, required=False)
        if digest and not DIGEST.match(digest):
            errors.append(f"{where}.config_digest: {digest!r} is not sha256:<64 hex digits> "
                          "(`docker image inspect -f '{{{{.Id}}}}' REF`)")
        if ref and "@" not in ref and ":" not in ref.rsplit("/", 1)[-1]:
            errors.append(f"{where}.ref: {ref!r} has no tag; name the exact tag (floating `latest` is not allowed)")
            continue
        if ref and ref.rsplit("/", 1)[-1].endswith(":latest"):
            errors.append(f"{where}.ref: {ref!r} is a floating tag; pin a version tag (and config_digest)")
            continue
        if name is None or ref is None:
            continue
        version = _text(item, "version", where, errors, required=False) or ref.rsplit(":", 1)[-1]
        file = image_file(ref)
        claim(file, where)
        m.images.append(ImageSpec(name, ref, version, file, digest, bool(item.get("optional", False))))

    wheels = data.get("wheels")
    if wheels is not None:
        where = f"{VAR}.wheels"
        if not isinstance(wheels, dict):
            errors.append(f"{where}: expected a mapping")
        else:
            pyver = _text(wheels, "python_version", where, errors, hint='the hosts\' Python, e.g. "3.11"')
            platforms = _list(wheels, "platforms", where, errors)
            if not platforms:
                errors.append(f"{where}.platforms: missing — the hosts' platform tags, e.g. [manylinux_2_36_x86_64]")
            reqs = _list(wheels, "requirements", where, errors)
            local = _list(wheels, "local_projects", where, errors)
            hashed = _list(wheels, "hashed", where, errors)
            for i, path in enumerate(hashed):
                if not Path(str(path)).is_file():
                    errors.append(f"{where}.hashed[{i}]: {path!r} is not a file — a requirements file pinned with "
                                  "hashes (pip-compile --generate-hashes)")
            if not reqs and not local and not hashed:
                errors.append(f"{where}: give requirements, local_projects and/or hashed")
            if pyver and not re.match(r"^3\.\d+$", pyver):
                errors.append(f"{where}.python_version: {pyver!r}; write major.minor, e.g. \"3.11\"")
            if pyver and platforms:
                impl = _text(wheels, "implementation", where, errors, required=False) or "cp"
                abi = _text(wheels, "abi", where, errors, required=False) or f"{impl}{pyver.replace('.', '')}"
                m.wheels = WheelSpec(pyver, [str(p) for p in platforms], [str(r) for r in reqs], impl, abi,
                                     [str(p) for p in local],
                                     _text(wheels, "constraints", where, errors, required=False),
                                     bool(wheels.get("no_deps", False)), [str(p) for p in hashed])

    coll = data.get("collection")
    if coll is not None:
        path = coll.get("path") if isinstance(coll, dict) else None
        if not path or not (Path(path) / "galaxy.yml").is_file():
            errors.append(f"{VAR}.collection.path: {path!r} is not a collection source (no galaxy.yml there)")
        else:
            m.collection = str(path)
    for i, name in enumerate(_list(data, "collections", VAR, errors)):
        if not isinstance(name, str) or not FQCN.match(name):
            errors.append(f"{VAR}.collections[{i}]: {name!r} is not namespace.name")
        else:
            m.collections.append(name)

    if errors:
        raise ManifestError(errors)
    return m
