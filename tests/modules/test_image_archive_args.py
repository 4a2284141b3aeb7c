"""image_archive's sha256 argument: a value that is not a SHA-256 is said so, not reported as a mismatch.
(The archive reading and loading tests, some with a Docker engine, are in tests/images.)"""

from __future__ import annotations

import hashlib

import pytest


@pytest.fixture
def tarball(tmp_path):
    path = tmp_path / "vllm.tar"
    path.write_bytes(b"not really an image archive")
    return path


@pytest.mark.parametrize("value", [
    "abc123",                    # too short
    "sha256:" + "0" * 64,        # a digest with its algorithm prefix
    "g" * 64,                    # not hex
    "0" * 65,                    # too long
])
def test_sha256_that_is_not_64_hex_digits_is_said_so(module_runner, tarball, value):
    result = module_runner("image_archive", {"path": str(tarball), "sha256": value, "cache": "",
                                             "executable": "/bin/true"})
    assert result.get("failed"), result
    assert result["msg"].startswith("sha256 must be 64 hex digits"), result["msg"]
    assert repr(value) in result["msg"] and "mismatch" not in result["msg"]
    assert result["loaded"] == []


def test_sha256_is_compared_whatever_its_case_and_surrounding_space(module_runner, tarball):
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    result = module_runner("image_archive", {"path": str(tarball), "sha256": f" {digest.upper()}\n",
                                             "cache": "", "executable": "/bin/true"})
    # verified, so the module went on to read the archive, which this file is not
    assert result["checksum"]["status"] == "verified", result
    assert "mismatch" not in result["msg"]


def test_real_mismatch_still_names_both_sums(module_runner, tarball):
    result = module_runner("image_archive", {"path": str(tarball), "sha256": "0" * 64, "cache": "",
                                             "executable": "/bin/true"})
    assert result.get("failed") and result["msg"].startswith("checksum mismatch for " + str(tarball))
    assert "0" * 64 in result["msg"] and hashlib.sha256(tarball.read_bytes()).hexdigest() in result["msg"]


def _docker_save_gz(path, ref, config_hex):
    """A gzipped archive in docker save's layout: a layer first, manifest.json at the end (as docker writes it)."""
    import gzip
    import io
    import json
    import tarfile
    with gzip.open(path, "wb") as raw, tarfile.open(fileobj=raw, mode="w") as archive:
        for name, data in ((f"blobs/sha256/{'1' * 64}", b"\0" * 4096),
                           ("manifest.json", json.dumps([{"Config": f"blobs/sha256/{config_hex}",
                                                         "RepoTags": [ref]}]).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def test_what_a_verified_tarball_holds_is_remembered_by_its_sum(module_runner, tmp_path):
    config = "c" * 64
    archive = tmp_path / "vllm.tar.gz"
    _docker_save_gz(archive, "dcu-serving/vllm-sim:0.11.0", config)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    engine = tmp_path / "docker"  # holds the image: `image inspect` prints its id
    engine.write_text(f"#!/bin/sh\necho sha256:{config}\n")
    engine.chmod(0o755)
    args = {"path": str(archive), "sha256": digest, "cache": str(tmp_path / "cache" / "sha256-cache.json"),
            "executable": str(engine)}
    store = tmp_path / "cache" / "image-archives.json"

    checked = module_runner("image_archive", dict(args, _ansible_check_mode=True))
    assert checked["images_cached"] is False and not store.exists(), "check mode writes no cache"
    first = module_runner("image_archive", args)
    second = module_runner("image_archive", args)
    assert (first["images_cached"], second["images_cached"]) == (False, True)
    assert first["images"] == second["images"] == [
        {"refs": ["dcu-serving/vllm-sim:0.11.0"], "config_digest": f"sha256:{config}", "present": True}]
    assert second["changed"] is False and second["already_loaded"] == ["dcu-serving/vllm-sim:0.11.0"]

    # A different file (another sum) is read, not taken from the memory of this one.
    other = tmp_path / "other.tar.gz"
    _docker_save_gz(other, "dcu-serving/proxy:0.1.0", config)
    third = module_runner("image_archive", dict(args, path=str(other),
                                                sha256=hashlib.sha256(other.read_bytes()).hexdigest()))
    assert third["images_cached"] is False and third["images"][0]["refs"] == ["dcu-serving/proxy:0.1.0"]
