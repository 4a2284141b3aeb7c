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
