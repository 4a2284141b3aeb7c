"""dcu.serving.config_files: a set of directories and files in one call, changed only where they differ."""

from __future__ import annotations

import os
import stat


def _files(tmp_path, **extra):
    etc = tmp_path / "etc"
    return {
        "directories": [{"path": str(etc), "mode": "0755"}],
        "files": [
            {"path": str(etc / "0.env"), "content": "DCU_VLLM_PORT=8001\n", "mode": "0644"},
            {"path": str(etc / "1.env"), "content": "DCU_VLLM_PORT=8002\n", "mode": "0644"},
            {"path": str(etc / "results.jsonl"), "state": "touch", "mode": "0640"},
        ],
        **extra,
    }


def test_first_call_writes_everything_and_the_second_changes_nothing(tmp_path, module_runner):
    first = module_runner("config_files", _files(tmp_path))
    assert first["changed"] is True, first
    assert (tmp_path / "etc" / "0.env").read_text() == "DCU_VLLM_PORT=8001\n"
    assert stat.S_IMODE((tmp_path / "etc" / "results.jsonl").stat().st_mode) == 0o640
    assert all(r["created"] for r in first["files"].values())

    second = module_runner("config_files", _files(tmp_path))
    assert second["changed"] is False, second
    assert not any(r["changed"] for r in second["files"].values())


def test_only_the_file_whose_content_differs_is_rewritten(tmp_path, module_runner):
    module_runner("config_files", _files(tmp_path))
    untouched = (tmp_path / "etc" / "0.env").stat().st_ino
    args = _files(tmp_path)
    args["files"][1]["content"] = "DCU_VLLM_PORT=8003\n"
    result = module_runner("config_files", args)
    changed = {os.path.basename(p) for p, r in result["files"].items() if r["changed"]}
    assert changed == {"1.env"}
    assert (tmp_path / "etc" / "1.env").read_text() == "DCU_VLLM_PORT=8003\n"
    assert (tmp_path / "etc" / "0.env").stat().st_ino == untouched


def test_a_touched_log_keeps_what_was_written_to_it(tmp_path, module_runner):
    module_runner("config_files", _files(tmp_path))
    log = tmp_path / "etc" / "results.jsonl"
    log.write_text('{"orid": "a"}\n')
    result = module_runner("config_files", _files(tmp_path))
    assert result["changed"] is False
    assert log.read_text() == '{"orid": "a"}\n'


def test_a_mode_that_drifted_is_put_back(tmp_path, module_runner):
    module_runner("config_files", _files(tmp_path))
    env = tmp_path / "etc" / "0.env"
    env.chmod(0o666)
    result = module_runner("config_files", _files(tmp_path))
    assert result["files"][str(env)] == {"changed": True, "created": False, "content_changed": False}
    assert stat.S_IMODE(env.stat().st_mode) == 0o644


def test_check_mode_reports_and_diffs_without_writing(tmp_path, module_runner):
    module_runner("config_files", _files(tmp_path))
    args = _files(tmp_path, _ansible_check_mode=True, _ansible_diff=True)
    args["files"][0]["content"] = "DCU_VLLM_PORT=9001\n"
    args["files"].append({"path": str(tmp_path / "new" / "x.env"), "content": "X=1\n"})
    result = module_runner("config_files", args)
    assert result["changed"] is True
    assert (tmp_path / "etc" / "0.env").read_text() == "DCU_VLLM_PORT=8001\n"
    assert not (tmp_path / "new").exists()
    [diff] = [d for d in result["diff"] if d["before_header"].endswith("0.env")]
    assert (diff["before"], diff["after"]) == ("DCU_VLLM_PORT=8001\n", "DCU_VLLM_PORT=9001\n")


def test_a_secret_file_diffs_without_its_content(tmp_path, module_runner):
    args = _files(tmp_path, _ansible_diff=True)
    args["files"][0].update(content="TOKEN=s3cret\n", no_log=True)
    result = module_runner("config_files", args)
    assert "s3cret" not in str(result["diff"])


def test_a_failed_validation_keeps_the_old_file_and_says_why(tmp_path, module_runner):
    module_runner("config_files", _files(tmp_path))
    args = _files(tmp_path)
    args["files"][0].update(content="broken\n", validate="sh -c 'echo bad setting in %s >&2; exit 3'")
    result = module_runner("config_files", args)
    assert result.get("failed") is True
    assert "bad setting" in result["msg"] and "0.env" in result["msg"]
    assert (tmp_path / "etc" / "0.env").read_text() == "DCU_VLLM_PORT=8001\n"
    assert [p.name for p in (tmp_path / "etc").iterdir() if p.name.startswith(".")] == []


def test_previous_content_comes_back_when_asked(tmp_path, module_runner):
    module_runner("config_files", _files(tmp_path))
    args = _files(tmp_path)
    args["files"][0].update(content="DCU_VLLM_PORT=8009\n", return_previous=True)
    result = module_runner("config_files", args)
    assert result["files"][args["files"][0]["path"]]["previous"] == "DCU_VLLM_PORT=8001\n"


def test_files_it_does_not_list_are_reported_not_removed(tmp_path, module_runner):
    module_runner("config_files", _files(tmp_path))
    stray = tmp_path / "etc" / "7.env"
    stray.write_text("DCU_VLLM_PORT=8008\n")
    result = module_runner("config_files", _files(tmp_path, unlisted=[{"path": str(tmp_path / "etc"),
                                                                       "pattern": "*.env"}]))
    assert result["unlisted"] == [str(stray)]
    assert stray.exists()


def test_a_relative_or_twice_listed_path_is_refused(tmp_path, module_runner):
    assert "absolute" in module_runner("config_files", {"files": [{"path": "x.env", "content": ""}]})["msg"]
    twice = _files(tmp_path)
    twice["files"].append(dict(twice["files"][0]))
    assert "listed twice" in module_runner("config_files", twice)["msg"]
