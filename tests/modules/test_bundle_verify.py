"""dcu.serving.bundle_verify: a whole bundle checked on the controller with only the collection (the verifier is
module_utils/bundle_index.py, which `dcu-bundle verify` runs too: one verifier, so no parity to keep)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support import make_bundle

FILES = {"driver/rock-1.0.run": b"#!/bin/sh\necho installer\n", "dtk/DTK-1.0.tar.gz": b"\x1f\x8b" + b"dtk" * 1000,
         "images/vllm.tar": os.urandom(4096)}


@pytest.fixture
def bundle(tmp_path) -> Path:
    make_bundle(tmp_path / "bundle", FILES)
    return tmp_path / "bundle"


def run(module_runner, bundle, tmp_path, **args):
    return module_runner("bundle_verify", {"path": str(bundle), "cache": str(tmp_path / "cache.json"), **args})


def test_an_intact_bundle_verifies_and_its_index_comes_back(module_runner, bundle, tmp_path):
    result = run(module_runner, bundle, tmp_path)
    assert not result.get("failed"), result
    assert result["ok"] and result["problems"] == [] and result["changed"] is False
    assert sorted(a["file"] for a in result["artifacts"]) == sorted(FILES)
    assert result["size"] == sum(len(d) for d in FILES.values())


def damage(bundle: Path):
    with open(bundle / "images/vllm.tar", "r+b") as f:  # one byte, same size
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 0xFF]))
    (bundle / "dtk/DTK-1.0.tar.gz").unlink()
    with open(bundle / "driver/rock-1.0.run", "ab") as f:
        f.write(b"# appended\n")
    (bundle / "wheels").mkdir()
    (bundle / "wheels/smuggled-1.0-py3-none-any.whl").write_bytes(b"not in the index")
    (bundle / "images/next.tar.part").write_bytes(b"interrupted")
    sums = (bundle / "SHA256SUMS").read_text().splitlines()
    (bundle / "SHA256SUMS").write_text("\n".join(sums[1:]) + "\n")  # one line lost


def test_every_problem_is_reported_each_with_what_is_wrong(module_runner, bundle, tmp_path):
    damage(bundle)
    result = run(module_runner, bundle, tmp_path, strict=False)
    assert not result.get("failed") and result["ok"] is False
    details = {(p["problem"], p["file"]): p["detail"] for p in result["problems"]}
    assert details[("missing", "dtk/DTK-1.0.tar.gz")] == "listed in index.json (dtk DTK 1.0) but absent"
    assert details[("size", "driver/rock-1.0.run")] == "expected 25 bytes, found 36"
    assert details[("mismatch", "images/vllm.tar")].startswith("expected sha256 ")
    assert details[("unlisted", "images/next.tar.part")] == "left by an interrupted build"
    assert details[("unlisted", "wheels/smuggled-1.0-py3-none-any.whl")] == "not listed in index.json"
    assert {(p["problem"], p["file"]) for p in result["problems"]} == {
        ("mismatch", "images/vllm.tar"), ("missing", "dtk/DTK-1.0.tar.gz"), ("size", "driver/rock-1.0.run"),
        ("sums", "driver/rock-1.0.run"), ("unlisted", "wheels/smuggled-1.0-py3-none-any.whl"),
        ("unlisted", "images/next.tar.part"),
    }


def test_strict_fails_naming_each_problem_and_what_to_do(module_runner, bundle, tmp_path):
    damage(bundle)
    result = run(module_runner, bundle, tmp_path)
    assert result["failed"]
    for text in ("6 problem(s)", "images/vllm.tar: mismatch", "dtk/DTK-1.0.tar.gz: missing",
                 "left by an interrupted build", "ansible-playbook dcu.serving.bundle"):
        assert text in result["msg"]
    assert "make bundle" not in result["msg"]


@pytest.mark.parametrize("index, problem", [
    (None, "missing — not a bundle"),
    ("{not json", "not valid JSON"),
    ('{"format": 2, "artifacts": []}', '"format": 1'),
    ('{"format": 1, "artifacts": [{"name": "x", "kind": "driver"}]}', "artifacts[0] lacks version, file, sha256"),
    ('{"format": 1, "artifacts": [{"name": "x", "kind": "firmware", "version": "1", "file": "x", "sha256": "",'
     ' "size": 0}]}', "kind 'firmware' is not one of"),
])
def test_an_unreadable_index_is_one_index_problem(module_runner, bundle, tmp_path, index, problem):
    if index is None:
        (bundle / "index.json").unlink()
    else:
        (bundle / "index.json").write_text(index)
    result = run(module_runner, bundle, tmp_path, strict=False)
    assert [p["problem"] for p in result["problems"]] == ["index"] and result["artifacts"] == []
    assert problem in result["problems"][0]["detail"]


@pytest.mark.parametrize("file, kind, problem", [
    ("../../../root/.ssh/authorized_keys", "driver", "is not a plain path (an empty, . or .. part)"),
    ("driver/../../etc/profile.d/x.sh", "driver", "is not a plain path"),
    ("/etc/profile.d/dtk.sh", "dtk", "is an absolute path; give it relative to the bundle (dtk/<name>)"),
    ("driver//rock.run", "driver", "is not a plain path"),
    ("index.json", "driver", "is not in driver/, the directory of kind driver"),
    ("wheels/rock.run", "driver", "is not in driver/, the directory of kind driver"),
    ("driver/rock.run\n0000  /etc/shadow", "driver", "holds a control character or a backslash"),
    ("driver\\..\\..\\x", "driver", "holds a control character or a backslash"),
])
def test_an_index_entry_that_leaves_its_directory_is_refused_before_anything_is_read(
        module_runner, bundle, tmp_path, file, kind, problem):
    """index.json's file is joined to the bundle and to the host's staging directory, where root writes: an
    entry that points elsewhere (or over index.json) makes the whole index unreadable, naming the entry."""
    (bundle / "index.json").write_text(json.dumps({"format": 1, "artifacts": [
        {"name": "x", "kind": kind, "version": "1", "file": file, "sha256": "0" * 64, "size": 1}]}))
    result = run(module_runner, bundle, tmp_path, strict=False)
    assert [p["problem"] for p in result["problems"]] == ["index"] and result["artifacts"] == []
    assert f"artifacts[0].file {file!r} {problem}" in result["problems"][0]["detail"]


def test_sums_are_cached_and_check_mode_writes_no_cache(module_runner, bundle, tmp_path):
    cache = tmp_path / "cache.json"
    run(module_runner, bundle, tmp_path, _ansible_check_mode=True)
    assert not cache.exists()
    run(module_runner, bundle, tmp_path)
    assert cache.exists()
    # same size and mtime, other bytes: the cached sum is trusted (as bundle_artifact and dcu-bundle do)
    target = bundle / "images/vllm.tar"
    stat = target.stat()
    target.write_bytes(bytes(b ^ 0xFF for b in target.read_bytes()))
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert run(module_runner, bundle, tmp_path)["ok"]
    assert not run(module_runner, bundle, tmp_path, cache="")["ok"]
