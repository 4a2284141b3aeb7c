"""dcu.serving.config_files: a set of directories and files in one call, changed only where they differ."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

from support import REPO


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


# --- how a file is written: its final mode before its first byte, on disk before the rename -----------------

IN_MODIFY, IN_ATTRIB, IN_CREATE, IN_MOVED_TO = 0x2, 0x4, 0x100, 0x80


def _inotify_events(directory: Path, action) -> list[tuple[str, int]]:
    """(name, mask) of every event in `directory` while action() runs, in order (Linux inotify, through libc)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        assert libc.inotify_add_watch(fd, bytes(directory), IN_MODIFY | IN_ATTRIB | IN_CREATE | IN_MOVED_TO) >= 0
        action()
        data = b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            data += chunk
    finally:
        os.close(fd)
    events, offset = [], 0
    while offset < len(data):
        _wd, mask, _cookie, length = struct.unpack_from("iIII", data, offset)
        name = data[offset + 16:offset + 16 + length].rstrip(b"\0").decode()
        events.append((name, mask))
        offset += 16 + length
    return events


def test_a_new_secret_file_has_its_mode_before_its_first_byte_and_never_changes_it_in_place(tmp_path, module_runner):
    """A new proxy.yml with the admin token: the temporary file is 0640 before the content goes in (a reader that
    opened it while wider would keep reading), and the file at its path is never chmod-ed after the rename (that
    was a window in which it was 0644)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    args = {"files": [{"path": str(etc / "proxy.yml"), "content": "admin_token: s3cret\n", "mode": "0640"}]}
    events = _inotify_events(etc, lambda: module_runner("config_files", args))
    assert stat.S_IMODE((etc / "proxy.yml").stat().st_mode) == 0o640
    moved = [i for i, (name, mask) in enumerate(events) if name == "proxy.yml" and mask & IN_MOVED_TO]
    assert len(moved) == 1, events
    assert [e for e in events[moved[0] + 1:] if e[0] == "proxy.yml"] == [], f"changed after the rename: {events}"
    temporary = [(name, mask) for name, mask in events if name.startswith(".proxy.yml.")]
    first_write = next(i for i, (_name, mask) in enumerate(temporary) if mask & IN_MODIFY)
    assert any(mask & IN_ATTRIB for _name, mask in temporary[:first_write]), f"written before its mode: {events}"


def test_a_replaced_file_keeps_the_attributes_the_spec_leaves_out(tmp_path, module_runner):
    etc = tmp_path / "etc"
    etc.mkdir()
    unit = etc / "x.service"
    unit.write_text("old\n")
    unit.chmod(0o604)
    module_runner("config_files", {"files": [{"path": str(unit), "content": "new\n"}]})
    assert unit.read_text() == "new\n" and stat.S_IMODE(unit.stat().st_mode) == 0o604
    module_runner("config_files", {"files": [{"path": str(etc / "y.env"), "content": "Y=1\n"}]})
    assert stat.S_IMODE((etc / "y.env").stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# The module as Ansible runs it, a process of its own, with os.fsync and os.rename recording what they do.
SPY = """
import os, runpy, sys
log = open(sys.argv[2], "a")
fsync, rename = os.fsync, os.rename
def spy_fsync(fd):
    log.write("fsync %s\\n" % os.readlink("/proc/self/fd/%d" % fd)); log.flush()
    return fsync(fd)
def spy_rename(src, dst, *args, **kwargs):
    log.write("rename %s %s\\n" % (os.fsdecode(src), os.fsdecode(dst))); log.flush()
    return rename(src, dst, *args, **kwargs)
os.fsync, os.rename = spy_fsync, spy_rename
sys.argv = [sys.argv[1], sys.argv[3]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_content_is_on_disk_before_the_rename_and_the_rename_after_it(tmp_path):
    etc = tmp_path / "etc"
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "directories": [{"path": str(etc), "mode": "0755"}],
        "files": [{"path": str(etc / "0.env"), "content": "DCU_VLLM_PORT=8002\n", "mode": "0644"}]}}))
    log = tmp_path / "calls.log"
    done = subprocess.run([sys.executable, "-c", SPY, str(REPO / "plugins/modules/config_files.py"), str(log),
                           str(args)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO / ".collections")))
    assert '"changed": true' in done.stdout, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    [rename] = [c for c in calls if c.startswith("rename ")]
    temporary = rename.split()[1]
    assert rename == f"rename {temporary} {etc / '0.env'}"
    assert calls.index(f"fsync {temporary}") < calls.index(rename) < calls.index(f"fsync {etc}"), calls
