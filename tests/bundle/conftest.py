"""Fixtures for the bundle tests: local sources only (emulated vendor files, a tiny local image,
this project's own wheel and collection)."""

from __future__ import annotations

import hashlib
import io
import subprocess
import uuid
from pathlib import Path

import pytest

from dcu_serving.bundle.build import Builder, Progress
from dcu_serving.bundle.checksum import ChecksumCache
from dcu_serving.bundle.manifest import parse
from support import REPO


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def vendor(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vendor")
    subprocess.run([str(REPO / "tools" / "build-vendor-artifacts"), "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return out


@pytest.fixture(scope="session")
def tiny_image():
    """A three-file image in the local engine (docker import), removed afterwards."""
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        pytest.fail("no Docker engine answers: run tools/ensure-docker (make unit does)")
    ref = f"dcu-bundle-test/tiny:{uuid.uuid4().hex[:8]}"
    subprocess.run(f"tar -C / -ch bin/sh lib/x86_64-linux-gnu/libc.so.6 lib64/ld-linux-x86-64.so.2 "
                   f"| docker import - {ref}", shell=True, check=True, stdout=subprocess.DEVNULL)
    yield ref
    subprocess.run(["docker", "rmi", "-f", ref], check=False, capture_output=True)


@pytest.fixture
def local_manifest(vendor) -> dict:
    """Every kind but images: a bundle built without a Docker engine."""
    run = vendor / "driver" / "rock-6.3.30-V1.4.1a.run"
    dtk = vendor / "dtk" / "DTK-26.04-Debian12-x86_64.tar.gz"
    return {
        "files": [
            {"name": "rock", "kind": "driver", "version": "6.3.30-V1.4.1a", "src": str(run), "sha256": sha256(run)},
            {"name": "dtk", "kind": "dtk", "version": "26.04", "src": str(dtk), "sha256": sha256(dtk)},
        ],
        "wheels": {"python_version": "3.11", "platforms": ["manylinux_2_36_x86_64"], "requirements": [],
                   "local_projects": [str(REPO)], "no_deps": True},
        "collection": {"path": str(REPO)},
        "collections": ["ansible.posix"],
    }


@pytest.fixture
def manifest(local_manifest, tiny_image) -> dict:
    """Every kind, a tiny image from the local engine included."""
    return {**local_manifest, "images": [{"name": "tiny", "ref": tiny_image}]}


@pytest.fixture
def build(tmp_path):
    """build(manifest_dict, out=None) -> Builder that has run (quiet, with its own sum cache)."""
    cache = ChecksumCache(tmp_path / "sha256-cache.json")

    def run(data: dict, out: Path | None = None) -> Builder:
        builder = Builder(parse(data), out or tmp_path / "bundle", cache, Progress(stream=io.StringIO()))
        builder.run()
        return builder

    return run
