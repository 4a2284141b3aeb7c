"""image_archive: reads archives without loading (also OCI layouts and non-archives, without an engine), and
against the real Docker engine loads only what is missing."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid

import pytest

from ansible_collections.dcu.serving.plugins.module_utils.image_archive import ArchiveError, read_images
from support import REPO

ANSIBLE = str(REPO / ".venv" / "bin" / "ansible")


def docker(*args, **kw) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True, **kw).stdout.strip()


@pytest.fixture
def tiny_image(tmp_path):
    """A real one-file image under a unique tag, saved with `docker save`; removed afterwards."""
    ref = f"dcu-test/image-archive:{uuid.uuid4().hex[:10]}"
    rootfs = io.BytesIO()
    with tarfile.open(fileobj=rootfs, mode="w") as t:
        data = ref.encode()
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    subprocess.run(["docker", "import", "-", ref], input=rootfs.getvalue(), check=True, capture_output=True)
    image_id = docker("image", "inspect", "--format", "{{.Id}}", ref)
    archive = tmp_path / "tiny.tar"
    docker("save", "-o", str(archive), ref)
    yield ref, image_id, archive
    subprocess.run(["docker", "rmi", "-f", image_id], capture_output=True)


def run_module(**args) -> dict:
    """Run the module through ansible against localhost and return its result."""
    check = args.pop("_check", False)
    # -i "localhost," is a host list; ANSIBLE_INVENTORY would split it into "localhost" and "", the current
    # directory, and parse every file of the checkout as inventory (minutes once build/ holds the venvs). Run as
    # the implicit localhost would: locally, with this Python.
    interpreter = f"ansible_python_interpreter={sys.executable}"
    cmd = [ANSIBLE, "localhost", "-i", "localhost,", "-c", "local", "-e", interpreter,
           "-m", "dcu.serving.image_archive", "-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
           "ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_CACHE_PLUGIN": "memory"}
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    doc = json.loads(out.stdout)
    return doc["plays"][0]["tasks"][0]["hosts"]["localhost"]


@pytest.mark.docker
def test_reads_refs_and_config_digest_without_loading(tiny_image):
    ref, image_id, archive = tiny_image
    assert read_images(archive) == [{"refs": [ref], "config_digest": image_id}]


@pytest.mark.docker
def test_reads_gzip_compressed_archives(tiny_image, tmp_path):
    ref, image_id, archive = tiny_image
    gz = tmp_path / "tiny.tar.gz"
    with open(archive, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert read_images(gz) == [{"refs": [ref], "config_digest": image_id}]


def test_oci_layout_is_understood(tmp_path):
    config_digest = "sha256:" + "c" * 64
    manifest = json.dumps({"config": {"digest": config_digest}}).encode()
    index = json.dumps({"manifests": [{"digest": "sha256:" + "a" * 64, "annotations": {
        "io.containerd.image.name": "example/vllm:0.11.0"}}]}).encode()
    path = tmp_path / "oci.tar"
    with tarfile.open(path, "w") as t:
        for name, data in (("index.json", index), ("blobs/sha256/" + "a" * 64, manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    assert read_images(path) == [{"refs": ["example/vllm:0.11.0"], "config_digest": config_digest}]


def test_not_an_archive_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(ArchiveError, match="not a readable image archive"):
        read_images(bad)


@pytest.mark.docker
def test_loads_only_when_missing_and_reports_honestly(tiny_image, tmp_path):
    ref, image_id, archive = tiny_image
    sha = subprocess.run(["sha256sum", str(archive)], capture_output=True, text=True).stdout.split()[0]
    cache = str(tmp_path / "cache.json")
    subprocess.run(["docker", "rmi", "-f", image_id], check=True, capture_output=True)

    would = run_module(path=str(archive), sha256=sha, cache=cache, _check=True)
    assert would["changed"] is True and would["loaded"] == [ref]
    assert subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode != 0

    first = run_module(path=str(archive), sha256=sha, cache=cache)
    assert first["changed"] is True and first["loaded"] == [ref] and first["checksum"]["cached"] is False
    assert docker("image", "inspect", "--format", "{{.Id}}", ref) == image_id

    second = run_module(path=str(archive), sha256=sha, cache=cache)
    assert second["changed"] is False and second["already_loaded"] == [ref] and second["loaded"] == []
    assert second["checksum"]["cached"] is True


@pytest.mark.docker
def test_corrupted_tarball_fails_with_file_expected_and_actual(tiny_image, tmp_path):
    _, _, archive = tiny_image
    result = run_module(path=str(archive), sha256="0" * 64, cache="")
    assert result["failed"] is True
    assert str(archive) in result["msg"] and "expected sha256 " + "0" * 64 in result["msg"]
    assert result["checksum"]["actual"] in result["msg"]
