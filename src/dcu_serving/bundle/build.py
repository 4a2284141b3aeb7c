"""Build a bundle from a manifest: fetch, save, download, pack — and skip what is already right.

Every artifact is written as `<file>.part`, checked, then renamed, so an interrupted build leaves
no half file under a real name. A re-run keeps each file whose inputs did not change and whose
bytes still verify (sums cached by path, size and mtime): nothing is re-downloaded or re-saved.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from dcu_serving.bundle import INDEX, KINDS, SUMS
from dcu_serving.bundle.artifact import Artifact, read_artifacts, write_artifacts
from dcu_serving.bundle.checksum import ChecksumCache
from dcu_serving.bundle.index import PART_SUFFIX, BundleIndexError
from dcu_serving.bundle.manifest import FileSpec, ImageSpec, Manifest, WheelSpec

CHUNK = 4 * 1024 * 1024
EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "1767225600"))


class BuildError(RuntimeError):
    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("the bundle build failed:\n  - " + "\n  - ".join(errors))


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Progress:
    """Progress lines on stderr for long steps, with sizes, at most every `interval` seconds."""

    def __init__(self, stream=None, interval: float = 2.0, log: Path | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.log = open(log, "a", buffering=1) if log else None  # noqa: SIM115 — lives as long as the build

    def say(self, text: str):
        line = f"dcu-bundle: {text}"
        print(line, file=self.stream, flush=True)
        if self.log:
            print(time.strftime("%H:%M:%S ") + line, file=self.log)

    def meter(self, label: str, total: int | None = None, approx: bool = False):
        return _Meter(self, label, total, approx)


class _Meter:
    def __init__(self, progress: Progress, label: str, total: int | None, approx: bool):
        self.p, self.label, self.total, self.approx = progress, label, total, approx
        self.done, self.start = 0, time.monotonic()
        self.last = self.start

    def advance(self, n: int):
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.p.interval:
            self.last = now
            rate = self.done / max(now - self.start, 1e-6)
            of = f" of {'~' if self.approx else ''}{human(self.total)}" if self.total else ""
            self.p.say(f"{self.label}: {human(self.done)}{of} ({human(rate)}/s)")


@dataclass
class Outcome:
    file: str
    action: str  # kept | fetched | saved | built | downloaded | removed | skipped
    size: int
    seconds: float
    note: str = ""


def wheel_requires_python(data: bytes) -> str:
    """The Requires-Python of a wheel's METADATA ("" when it states none)."""
    with zipfile.ZipFile(io.BytesIO(data)) as wheel:
        names = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        metadata = HeaderParser().parsestr(wheel.read(names[0]).decode("utf-8")) if len(names) == 1 else {}
    return (metadata.get("Requires-Python") or "").strip()


class Builder:
    def __init__(self, manifest: Manifest, out: Path, cache: ChecksumCache, progress: Progress | None = None):
        self.m, self.out, self.cache = manifest, out, cache
        self.progress = progress or Progress()
        self.outcomes: list[Outcome] = []
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.previous: dict[str, Artifact] = {}

    # -- helpers ---------------------------------------------------------------------------------
    def _verified(self, file: str, sha256: str) -> bool:
        path = self.out / file
        return path.is_file() and self.cache.sha256(path) == sha256

    def _stream(self, file: str, chunks, label: str, total: int | None = None,
                approx: bool = False) -> tuple[Path, str, int]:
        """Write chunks to <file>.part while hashing them; returns (part path, sha256, size)."""
        part = self.out / (file + PART_SUFFIX)
        part.parent.mkdir(parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        meter = self.progress.meter(label, total, approx)
        with open(part, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                meter.advance(len(chunk))
        return part, digest.hexdigest(), size

    def _install(self, part: Path, file: str, sha256: str):
        dest = self.out / file
        part.replace(dest)
        self.cache.remember(dest, sha256)

    def _put_bytes(self, file: str, data: bytes) -> bool:
        """Write bytes unless the file already holds them; True when written."""
        dest = self.out / file
        digest = hashlib.sha256(data).hexdigest()
        prev = self.previous.get(file)
        if dest.is_file() and dest.stat().st_size == len(data) and (
                (prev and prev.sha256 == digest and self._verified(file, digest)) or dest.read_bytes() == data):
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + PART_SUFFIX)
        part.write_bytes(data)
        self._install(part, file, digest)
        return True

    def _record(self, art: Artifact, action: str, start: float, note: str = ""):
        self.outcomes.append(Outcome(art.file, action, art.size, time.monotonic() - start, note))
        if action != "kept":
            self.progress.say(f"{action} {art.file} ({human(art.size)}, {time.monotonic() - start:.1f}s)")

    # -- files: copied or downloaded, checked against the manifest's sum -------------------------------
    def file(self, spec: FileSpec) -> Artifact | None:
        start = time.monotonic()
        art = Artifact(spec.name, spec.kind, spec.version, spec.file, spec.sha256, 0, spec.src)
        if self._verified(spec.file, spec.sha256):
            art.size = (self.out / spec.file).stat().st_size
            self._record(art, "kept", start)
            return art
        try:
            part, digest, size = self._fetch(spec)
        except OSError as e:
            self.errors.append(f"{spec.file}: cannot fetch {spec.src}: {e}")
            return None
        if digest != spec.sha256:
            part.unlink()
            self.errors.append(f"{spec.file}: {spec.src} has sha256 {digest}, the manifest says {spec.sha256} — "
                               "a different or corrupt file; fix the source or, if the new file is right, its sha256")
            return None
        self._install(part, spec.file, digest)
        art.size = size
        self._record(art, "fetched", start)
        return art

    def _fetch(self, spec: FileSpec) -> tuple[Path, str, int]:
        label = f"{spec.file} from {spec.src}"
        if re.match(r"^https?://", spec.src):
            return self._download(spec, label)
        path = Path(spec.src[len("file://"):] if spec.src.startswith("file://") else spec.src)
        with open(path, "rb") as f:
            return self._stream(spec.file, iter(lambda: f.read(CHUNK), b""), label, path.stat().st_size)

    def _download(self, spec: FileSpec, label: str) -> tuple[Path, str, int]:
        """HTTP(S) download that resumes a `.part` left by an interrupted run (Range request)."""
        part = self.out / (spec.file + PART_SUFFIX)
        part.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.is_file() else 0
        req = urllib.request.Request(spec.src, headers={"Range": f"bytes={have}-"} if have else {})
        with urllib.request.urlopen(req, timeout=60) as resp:
            resumed = have and resp.status == 206
            digest = hashlib.sha256()
            if resumed:
                with open(part, "rb") as f:
                    for block in iter(lambda: f.read(CHUNK), b""):
                        digest.update(block)
                self.progress.say(f"{spec.file}: resuming after {human(have)}")
            else:
                have = 0
            length = resp.headers.get("Content-Length")
            meter = self.progress.meter(label, have + int(length) if length else None)
            meter.done = have
            with open(part, "ab" if resumed else "wb") as f:
                for chunk in iter(lambda: resp.read(CHUNK), b""):
                    f.write(chunk)
                    digest.update(chunk)
                    meter.advance(len(chunk))
        return part, digest.hexdigest(), part.stat().st_size

    # -- images: docker save, refs and config digest recorded --------------------------------------
    def image(self, spec: ImageSpec) -> Artifact | None:
        start = time.monotonic()
        found = subprocess.run(["docker", "image", "inspect", spec.ref], capture_output=True, text=True, check=False)
        if found.returncode != 0:
            if spec.optional:
                self.warnings.append(f"{spec.file}: image {spec.ref} is not in the local engine; left out (optional)")
                self.outcomes.append(Outcome(spec.file, "skipped", 0, 0.0, "optional image absent"))
                return None
            self.errors.append(f"{spec.file}: image {spec.ref} is not in the local Docker engine: "
                               "load, build or pull it on this staging machine first")
            return None
        info = json.loads(found.stdout)[0]
        config_digest = info["Id"]
        if spec.config_digest and spec.config_digest != config_digest:
            self.errors.append(f"{spec.file}: {spec.ref} has config digest {config_digest}, the manifest pins "
                               f"{spec.config_digest}: the tag now names another image")
            return None
        extra = {"refs": [spec.ref], "config_digest": config_digest}
        prev = self.previous.get(spec.file)
        if prev and prev.extra.get("config_digest") == config_digest and prev.extra.get("refs") == [spec.ref] \
                and self._verified(spec.file, prev.sha256):
            art = Artifact(spec.name, "image", spec.version, spec.file, prev.sha256, prev.size, prev.source, extra)
            self._record(art, "kept", start)
            return art
        # gzip -1 beside docker save (its own process, so the two run on two cores); -n keeps the bytes the same
        # from one save of the same image to the next.
        proc = subprocess.Popen(["docker", "save", spec.ref], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        gzip = subprocess.Popen(["gzip", "-1", "-n", "-c"], stdin=proc.stdout, stdout=subprocess.PIPE)
        proc.stdout.close()  # gzip holds the pipe now: docker save sees it close if gzip dies
        part, digest, size = self._stream(spec.file, iter(lambda: gzip.stdout.read(CHUNK), b""),
                                          f"saving {spec.ref}", int(info.get("Size", 0)) // 3 or None, approx=True)
        if proc.wait() != 0 or gzip.wait() != 0:
            part.unlink()
            self.errors.append(f"{spec.file}: docker save {spec.ref} | gzip failed: "
                               f"{proc.stderr.read().decode().strip() or f'gzip exit {gzip.returncode}'}")
            return None
        self._install(part, spec.file, digest)
        art = Artifact(spec.name, "image", spec.version, spec.file, digest, size, "local Docker engine (docker save)",
                       extra)
        self._record(art, "saved", start)
        return art

    # -- wheels: the hosts' Python and platform, resolved with pip --------------------------------
    def wheels(self, spec: WheelSpec) -> list[Artifact]:
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="dcu-bundle-wheels.") as tmp:
            local = []
            for project in spec.local_projects:
                local.append(self._build_local_wheel(Path(project), Path(tmp) / "local"))
            if None in local:
                return []
            request = {
                "python_version": spec.python_version, "platforms": spec.platforms,
                "implementation": spec.implementation, "abi": spec.abi, "requirements": spec.requirements,
                "constraints_sha256": hashlib.sha256(Path(spec.constraints).read_bytes()).hexdigest()
                if spec.constraints else None,
                "local": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in local},
                "no_deps": spec.no_deps,
                "hashed": {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in spec.hashed},
            }
            prev = [a for a in self.previous.values() if a.kind == "wheel"]
            if prev and all(a.extra.get("resolved_by") == request and self._verified(a.file, a.sha256) for a in prev):
                for a in prev:
                    self._record(a, "kept", start)
                return prev
            dest = Path(tmp) / "download"
            base = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                    "--only-binary", ":all:", "--python-version", spec.python_version,
                    "--implementation", spec.implementation, "--abi", spec.abi, "--dest", str(dest)]
            for platform in expand_platforms(spec.platforms):
                base += ["--platform", platform]
            runs = []
            if spec.requirements or local:
                cmd = list(base)
                if spec.constraints:
                    cmd += ["--constraint", spec.constraints]
                if spec.no_deps:
                    cmd.append("--no-deps")
                runs.append([*cmd, *spec.requirements, *map(str, local)])
            # A hashed file is resolved on its own: pip checks every wheel against the file's hashes, and
            # hash-checking mode cannot mix with the unpinned requirements above.
            runs += [[*base, "--require-hashes", "--requirement", path] for path in spec.hashed]
            self.progress.say(f"wheels: pip download for cp{spec.python_version.replace('.', '')} "
                              f"{', '.join(spec.platforms)} ({len(spec.requirements) + len(local)} requirement(s)"
                              f"{', ' + ', '.join(spec.hashed) if spec.hashed else ''})")
            for cmd in runs:
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    self.errors.append(f"wheels: pip download failed (exit {done.returncode}):\n"
                                       f"{done.stderr.strip()[-2000:]}")
                    return []
            local_names = {p.name for p in local}
            arts = []
            for whl in sorted(dest.glob("*.whl")):
                data = whl.read_bytes()
                file = f"wheels/{whl.name}"
                dist, version = whl.name.split("-")[:2]
                source = ("built from the project source (pip wheel)" if whl.name in local_names
                          else "PyPI (pip download)")
                written = self._put_bytes(file, data)
                # Requires-Python in the index: dcu_proxy decides venv or container without reading the wheel.
                art = Artifact(dist.replace("_", "-").lower(), "wheel", version, file,
                               hashlib.sha256(data).hexdigest(), len(data), source,
                               {"resolved_by": request, "requires_python": wheel_requires_python(data)})
                self._record(art, "downloaded" if written else "kept", start)
                arts.append(art)
            return arts

    def _build_local_wheel(self, project: Path, dest: Path) -> Path | None:
        dest.mkdir(parents=True, exist_ok=True)
        before = set(dest.glob("*.whl"))
        with tempfile.TemporaryDirectory(prefix="dcu-bundle-src.") as src:
            # Build from a clean copy: no stale build/ or egg-info from the checkout leaks into the wheel.
            ignore = shutil.ignore_patterns(".git", ".venv", ".collections", "build", "bundle", "*.egg-info",
                                            "__pycache__", ".pytest_cache", ".ruff_cache", "molecule", "tests")
            copy = Path(src) / project.name
            shutil.copytree(project, copy, ignore=ignore, symlinks=True)
            done = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
                 "--no-build-isolation", "--wheel-dir", str(dest), str(copy)],
                capture_output=True, text=True, check=False, env={**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH)})
        built = set(dest.glob("*.whl")) - before
        if done.returncode != 0 or len(built) != 1:
            self.errors.append(f"wheels: cannot build {project}: {done.stderr.strip()[-1500:]}")
            return None
        return built.pop()

    # -- collections ---------------------------------------------------------------------------------
    def own_collection(self, path: Path) -> Artifact | None:
        start = time.monotonic()
        search = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        galaxy = shutil.which("ansible-galaxy", path=search)
        if not galaxy:
            self.errors.append("collection: ansible-galaxy not found (install ansible-core on the staging machine)")
            return None
        with tempfile.TemporaryDirectory(prefix="dcu-bundle-coll.") as tmp:
            done = subprocess.run([galaxy, "collection", "build", "--force", "--output-path", tmp, str(path)],
                                  capture_output=True, text=True, check=False)
            built = list(Path(tmp).glob("*.tar.gz"))
            if done.returncode != 0 or len(built) != 1:
                self.errors.append(f"collection: ansible-galaxy collection build {path} failed: "
                                   f"{(done.stderr or done.stdout).strip()[-1500:]}")
                return None
            tarball = built[0]
            manifest = _member(tarball, "MANIFEST.json")
            info = json.loads(manifest)["collection_info"]
            file = f"collections/{tarball.name}"
            name, version = f"{info['namespace']}.{info['name']}", info["version"]
            source = f"built from {path} (ansible-galaxy collection build)"
            prev = self.previous.get(file)
            # ansible-galaxy stamps the build time into the tar: same MANIFEST.json (which carries the
            # sum of FILES.json, which carries every file's sum) means the same collection.
            if prev and self._verified(file, prev.sha256) and _member(self.out / file, "MANIFEST.json") == manifest:
                art = Artifact(name, "collection", version, file, prev.sha256, prev.size, source)
                self._record(art, "kept", start)
                return art
            data = tarball.read_bytes()
            self._put_bytes(file, data)
        art = Artifact(name, "collection", version, file, hashlib.sha256(data).hexdigest(), len(data), source)
        self._record(art, "built", start)
        return art

    def installed_collections(self, names: list[str]) -> list[Artifact]:
        arts, todo, done = [], list(names), set()
        while todo:
            fqcn = todo.pop(0)
            if fqcn in done:
                continue
            done.add(fqcn)
            start = time.monotonic()
            path = _installed_collection(fqcn)
            if path is None:
                self.errors.append(f"collections: {fqcn} is not installed with the `ansible` package here "
                                   "(pip install ansible, or remove it from the manifest)")
                continue
            info = json.loads((path / "MANIFEST.json").read_text())["collection_info"]
            todo.extend(info.get("dependencies") or {})
            data = repack_collection(path)
            file = f"collections/{info['namespace']}-{info['name']}-{info['version']}.tar.gz"
            written = self._put_bytes(file, data)
            art = Artifact(fqcn, "collection", info["version"], file, hashlib.sha256(data).hexdigest(), len(data),
                           f"repacked from the installed ansible package ({path})")
            self._record(art, "built" if written else "kept", start)
            arts.append(art)
        return arts

    # -- the whole bundle -------------------------------------------------------------------------------
    def run(self) -> list[Artifact]:
        self.out.mkdir(parents=True, exist_ok=True)
        try:
            self.previous = {a.file: a for a in read_artifacts(self.out)}
        except BundleIndexError:
            self.previous = {}
        arts: list[Artifact | None] = []
        arts += [self.file(s) for s in self.m.files]
        arts += [self.image(s) for s in self.m.images]
        if self.m.wheels:
            arts += self.wheels(self.m.wheels)
        if self.m.collection:
            arts.append(self.own_collection(Path(self.m.collection)))
        arts += self.installed_collections(self.m.collections)
        if self.errors:
            raise BuildError(self.errors)
        final = [a for a in arts if a is not None]
        keep = {a.file for a in final}
        for file, old in sorted(self.previous.items()):
            if file not in keep and (self.out / file).is_file():
                (self.out / file).unlink()
                self.outcomes.append(Outcome(file, "removed", old.size, 0.0, "no longer in the manifest"))
                self.progress.say(f"removed {file} (no longer in the manifest)")
        for sub in KINDS.values():  # drop directories emptied by removals
            d = self.out / sub
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        if write_artifacts(self.out, final):
            self.progress.say(f"wrote {INDEX} and {SUMS} ({len(final)} artifacts)")
        return final


def expand_platforms(platforms: list[str]) -> list[str]:
    """manylinux_2_N_<arch> → every tag a host with glibc 2.N accepts, as pip does on that host.

    `pip download --platform` takes tags literally, so a wheel tagged manylinux_2_17 would not match
    a manylinux_2_36 request. The legacy aliases (manylinux2014 = 2.17, 2010 = 2.12, 1 = 2.5) follow.
    """
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags: list[str] = []
    for platform in platforms:
        m = re.match(r"^manylinux_2_(\d+)_(\w+)$", platform)
        if not m:
            tags.append(platform)
            continue
        newest, arch = int(m.group(1)), m.group(2)
        for minor in range(newest, 4, -1):
            tags.append(f"manylinux_2_{minor}_{arch}")
            if minor in legacy:
                tags.append(f"{legacy[minor]}_{arch}")
    return list(dict.fromkeys(tags))


def _member(tarball: Path, name: str) -> bytes | None:
    try:
        with tarfile.open(tarball) as tar:
            f = tar.extractfile(name)
            return f.read() if f else None
    except (OSError, tarfile.TarError, KeyError):
        return None


def _installed_collection(fqcn: str) -> Path | None:
    ns, name = fqcn.split(".")
    spec = importlib.util.find_spec("ansible_collections")
    for root in (spec.submodule_search_locations if spec else []) or []:
        path = Path(root, ns, name)
        if (path / "MANIFEST.json").is_file():
            return path
    return None


def repack_collection(path: Path) -> bytes:
    """A collection artifact (what `ansible-galaxy collection install` takes) from an installed copy.

    The `ansible` package drops tests and CI files but keeps the upstream FILES.json, so FILES.json
    and MANIFEST.json are rewritten to list exactly the files present, with their sums — otherwise
    the install refuses the tarball. Reproducible: sorted members, fixed mtimes and owners.
    """
    manifest = json.loads((path / "MANIFEST.json").read_text())
    listed = json.loads((path / "FILES.json").read_text())
    entries, members = [], []
    for entry in listed["files"]:
        name = entry["name"]
        full = path / name
        if "__pycache__" in name.split("/"):
            continue
        if entry["ftype"] == "dir":
            if name == "." or full.is_dir():
                entries.append(entry)
                if name != ".":
                    members.append((name, None))
        elif full.is_file():
            data = full.read_bytes()
            entries.append(dict(entry, chksum_sha256=hashlib.sha256(data).hexdigest()))
            members.append((name, data))
    files_json = json.dumps({"files": entries, "format": listed.get("format", 1)}, indent=4).encode()
    manifest["file_manifest_file"]["chksum_sha256"] = hashlib.sha256(files_json).hexdigest()
    manifest_json = json.dumps(manifest, indent=4).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in [("MANIFEST.json", manifest_json), ("FILES.json", files_json), *members]:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = EPOCH, 0, 0, "root", "root"
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                info.mode = 0o755 if os.access(path / name, os.X_OK) and name != "MANIFEST.json" \
                    and name != "FILES.json" else 0o644
                tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()
