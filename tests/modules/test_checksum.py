"""Cached SHA-256 of bundle artifacts and the bundle_artifact module."""

from __future__ import annotations

import hashlib
import json
import os

from ansible_collections.dcu.serving.plugins.module_utils import checksum


def _artifact(tmp_path, data=b"rock installer payload\n" * 1000):
    path = tmp_path / "driver" / "rock-6.3.30-V1.4.1a.run"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def test_verified_missing_mismatch(tmp_path):
    path, digest = _artifact(tmp_path)
    assert checksum.verify(str(path), digest.upper())["status"] == "verified"
    missing = checksum.verify(str(tmp_path / "absent.run"), digest)
    assert missing["status"] == "missing" and missing["actual"] is None
    wrong = checksum.verify(str(path), "0" * 64)
    assert wrong["status"] == "mismatch" and wrong["actual"] == digest and wrong["expected"] == "0" * 64


def test_cache_skips_reading_an_unchanged_file(tmp_path, monkeypatch):
    path, digest = _artifact(tmp_path)
    cache = checksum.ChecksumCache(str(tmp_path / "cache" / "sha256.json"))
    first = checksum.verify(str(path), digest, cache)
    assert first["status"] == "verified" and first["cached"] is False

    def no_reading(_path):
        raise AssertionError("an unchanged file must not be read again")
    monkeypatch.setattr(checksum, "sha256_file", no_reading)
    second = checksum.verify(str(path), digest, cache)
    assert second["status"] == "verified" and second["cached"] is True


def test_cache_notices_a_changed_file(tmp_path):
    path, digest = _artifact(tmp_path)
    cache = checksum.ChecksumCache(str(tmp_path / "sha256.json"))
    checksum.verify(str(path), digest, cache)
    # Same size, different content and mtime: the cached sum must not be trusted.
    stat = path.stat()
    path.write_bytes(b"X" + path.read_bytes()[1:])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    result = checksum.verify(str(path), digest, cache)
    assert result["status"] == "mismatch" and result["cached"] is False


def test_cache_file_keyed_by_real_path_size_and_mtime(tmp_path):
    path, digest = _artifact(tmp_path)
    link = tmp_path / "current.run"
    link.symlink_to(path)
    cache_file = tmp_path / "sha256.json"
    checksum.verify(str(link), digest, checksum.ChecksumCache(str(cache_file)))
    entries = json.loads(cache_file.read_text())
    assert entries == {str(path): {"size": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns,
                                   "sha256": digest}}


def test_cache_not_written_when_write_is_off(tmp_path):
    path, digest = _artifact(tmp_path)
    cache_file = tmp_path / "sha256.json"
    checksum.verify(str(path), digest, checksum.ChecksumCache(str(cache_file), write=False))
    assert not cache_file.exists()


def test_module_reports_without_failing_by_default(tmp_path, module_runner):
    path, digest = _artifact(tmp_path)
    cache = str(tmp_path / "c.json")
    ok = module_runner("bundle_artifact", {"path": str(path), "sha256": digest, "cache": cache})
    assert ok["status"] == "verified" and ok["verified"] is True and ok["changed"] is False
    again = module_runner("bundle_artifact", {"path": str(path), "sha256": digest, "cache": cache})
    assert again["cached"] is True
    missing = module_runner("bundle_artifact", {"path": str(tmp_path / "nope"), "sha256": digest, "cache": cache})
    assert missing["status"] == "missing" and not missing.get("failed")


def test_module_strict_mismatch_names_file_expected_and_actual(tmp_path, module_runner):
    path, digest = _artifact(tmp_path)
    result = module_runner("bundle_artifact", {
        "path": str(path), "sha256": "ab" * 32, "name": "driver/rock-6.3.30-V1.4.1a.run",
        "strict": True, "cache": ""})
    assert result["failed"] is True
    assert "checksum mismatch for driver/rock-6.3.30-V1.4.1a.run" in result["msg"]
    assert "ab" * 32 in result["msg"] and digest in result["msg"]


def test_module_rejects_a_malformed_sum(tmp_path, module_runner):
    path, _digest = _artifact(tmp_path)
    result = module_runner("bundle_artifact", {"path": str(path), "sha256": "md5:1234"})
    assert result["failed"] is True and "64 hex digits" in result["msg"]


def test_module_check_mode_leaves_no_cache(tmp_path, module_runner):
    path, digest = _artifact(tmp_path)
    cache = tmp_path / "c.json"
    result = module_runner("bundle_artifact", {"path": str(path), "sha256": digest, "cache": str(cache),
                                               "_ansible_check_mode": True})
    assert result["status"] == "verified" and not cache.exists()


def test_module_checks_a_list_of_artifacts_in_one_call_shaped_as_a_loop(tmp_path, module_runner):
    """One round trip for the whole list (staging 153 artifacts took 50 s one call each); the results carry each
    entry as `item`, as a registered loop does, so the role's filters read them the same way."""
    path, digest = _artifact(tmp_path)
    entries = [{"file": "driver/rock-6.3.30-V1.4.1a.run", "sha256": digest, "size": path.stat().st_size},
               {"file": "wheels/absent.whl", "sha256": digest},
               {"file": "driver/rock-6.3.30-V1.4.1a.run", "sha256": "cd" * 32}]
    cache = str(tmp_path / "c.json")
    result = module_runner("bundle_artifact", {"artifacts": entries, "directory": str(tmp_path), "cache": cache})
    assert not result.get("failed") and result["changed"] is False
    assert [(r["item"], r["status"], r["verified"]) for r in result["results"]] == [
        (entries[0], "verified", True), (entries[1], "missing", False), (entries[2], "mismatch", False)]
    assert result["results"][0]["path"] == str(path) and result["results"][1]["name"] == "wheels/absent.whl"
    again = module_runner("bundle_artifact", {"artifacts": entries[:1], "directory": str(tmp_path), "cache": cache})
    assert again["results"][0]["cached"] is True

    strict = module_runner("bundle_artifact", {"artifacts": entries, "directory": str(tmp_path), "strict": True,
                                               "cache": ""})
    assert strict["failed"] is True and strict["msg"].startswith("2 of 3 artifacts do not verify: ")
    assert "wheels/absent.whl is missing at" in strict["msg"] and "checksum mismatch for driver/rock" in strict["msg"]


def test_module_refuses_a_list_entry_outside_its_directory_or_without_a_sum(tmp_path, module_runner):
    _path, digest = _artifact(tmp_path)
    for entry, says in (({"file": "../etc/shadow", "sha256": digest}, "a relative path inside directory"),
                        ({"file": "/etc/shadow", "sha256": digest}, "a relative path inside directory"),
                        ({"file": "driver/rock-6.3.30-V1.4.1a.run"}, "sha256 of driver/rock-6.3.30-V1.4.1a.run must")):
        result = module_runner("bundle_artifact", {"artifacts": [entry], "directory": str(tmp_path)})
        assert result["failed"] is True and says in result["msg"], result
    both = module_runner("bundle_artifact",
                         {"artifacts": [], "directory": str(tmp_path), "path": "/x", "sha256": digest})
    assert both["failed"] is True and "mutually exclusive" in both["msg"]
