"""dcu.serving.bundle_send's parts: the ranges of a file, the controller's remembered range sums, its read-ahead
and the one stream of every range into the receiver the host runs (each range written at its offset, hashed,
recorded only when whole and on disk, so an interrupted stream resumes with the others), the progress file it
leaves, and the module's host side (status, finish)."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.dcu.serving.plugins.action.bundle_send import ActionModule
from ansible_collections.dcu.serving.plugins.modules.bundle_send import read_progress
from ansible_collections.dcu.serving.plugins.plugin_utils.bundle_transfer import (
    RECEIVER,
    hash_ranges,
    load_sums,
    ranges_of,
    read_ahead,
    received,
    spec_of,
    store_sums,
    stream,
    sums_path,
)

MIB = 1048576


@pytest.mark.parametrize("size, chunk, ranges", [
    (0, MIB, []),
    (1, MIB, [(0, 0, 1)]),
    (MIB, MIB, [(0, 0, MIB)]),
    (MIB + 1, MIB, [(0, 0, MIB), (1, MIB, 1)]),
    (2500, 1000, [(0, 0, 1000), (1, 1000, 1000), (2, 2000, 500)]),
])
def test_ranges_cover_the_file_once(size, chunk, ranges):
    assert ranges_of(size, chunk) == ranges


def test_ranges_refuse_nonsense():
    with pytest.raises(ValueError, match="positive"):
        ranges_of(10, 0)


def test_range_sums_are_remembered_per_artifact_and_range_size(tmp_path):
    cache = str(tmp_path / "cache" / "sha256-cache.json")
    path = sums_path("a" * 64, MIB, cache)
    assert path == str(tmp_path / "cache" / "ranges" / f"{'a' * 64}-{MIB}.json")
    assert sums_path("a" * 64, 2 * MIB, cache) != path
    assert load_sums(path, "a" * 64, 2) is None
    store_sums(path, "a" * 64, ["b" * 64, "c" * 64])
    assert load_sums(path, "a" * 64, 2) == ["b" * 64, "c" * 64]
    assert load_sums(path, "a" * 64, 3) is None  # another count of ranges: not these sums
    assert load_sums(path, "d" * 64, 2) is None  # another artifact
    with open(path, "w") as handle:
        handle.write("{not json")
    assert load_sums(path, "a" * 64, 2) is None


def test_the_controller_hashes_each_range_and_the_whole_in_order(tmp_path):
    blob = os.urandom(2500)
    (tmp_path / "src").write_bytes(blob)
    sums, whole = hash_ranges(str(tmp_path / "src"), ranges_of(2500, 1000))
    assert sums == [hashlib.sha256(blob[o:o + 1000]).hexdigest() for o in (0, 1000, 2000)]
    assert whole == hashlib.sha256(blob).hexdigest()
    with pytest.raises(AnsibleActionFail, match="did it change"):
        hash_ranges(str(tmp_path / "src"), ranges_of(3000, 1000))


def test_read_ahead_yields_the_ranges_asked_for_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr("ansible_collections.dcu.serving.plugins.plugin_utils.bundle_transfer.READ", 300)
    blob = os.urandom(2500)
    (tmp_path / "src").write_bytes(blob)
    items = list(read_ahead(str(tmp_path / "src"), ranges_of(2500, 1000), depth=2))
    assert [index for index, block in items if block is None] == [0, 1, 2]
    assert max(len(block or b"") for _index, block in items) == 300
    assert b"".join(block for _index, block in items if block) == blob
    some = [(2, 2000, 500), (0, 0, 1000)]
    assert b"".join(b for _i, b in read_ahead(str(tmp_path / "src"), some) if b) == blob[2000:] + blob[:1000]
    with pytest.raises(AnsibleActionFail, match="did it change"):
        list(read_ahead(str(tmp_path / "src"), [(3, 2000, 1000)]))


def test_read_ahead_stops_its_thread_when_the_consumer_stops(tmp_path, monkeypatch):
    import threading
    monkeypatch.setattr("ansible_collections.dcu.serving.plugins.plugin_utils.bundle_transfer.READ", 100)
    (tmp_path / "src").write_bytes(os.urandom(10000))
    before = threading.active_count()
    blocks = read_ahead(str(tmp_path / "src"), ranges_of(10000, 1000), depth=1)
    next(blocks)
    blocks.close()
    assert threading.active_count() == before


def receiver_argv(tmp_path, todo, python=sys.executable, whole=False):
    return [python, "-c", RECEIVER, str(tmp_path / "data"), str(tmp_path / "progress"), spec_of(todo), str(int(whole))]


def receive(tmp_path, data: bytes, todo, whole=False):
    proc = subprocess.run(receiver_argv(tmp_path, todo, whole=whole), input=data, capture_output=True, timeout=60)
    return proc.returncode, json.loads(proc.stdout)


def test_the_receiver_writes_each_range_at_its_offset_and_records_it(tmp_path):
    blob = os.urandom(2500)
    todo = [(2, 2000, 500), (0, 0, 1000)]  # any order, back to back in one command
    rc, out = receive(tmp_path, blob[2000:] + blob[:1000], todo)
    assert rc == 0 and out["error"] is None and out["whole"] is None  # not asked for
    assert out["ranges"] == [{"index": i, "size": n, "sha256": hashlib.sha256(blob[o:o + n]).hexdigest()}
                             for i, o, n in todo]
    rc, out = receive(tmp_path, blob[1000:2000], [(1, 1000, 1000)])
    assert rc == 0
    assert (tmp_path / "data").read_bytes() == blob
    assert read_progress(str(tmp_path / "progress")) == {
        i: hashlib.sha256(blob[i * 1000:(i + 1) * 1000]).hexdigest() for i in range(3)}


def test_a_range_cut_short_is_not_recorded_and_the_whole_ones_before_it_are(tmp_path):
    blob = os.urandom(2500)
    rc, out = receive(tmp_path, blob[:1000] + blob[1000:1010], ranges_of(2500, 1000), whole=True)
    assert rc == 3 and out["ranges"][1] == {"index": 1, "size": 10, "sha256": None} and out["whole"] is None
    assert read_progress(str(tmp_path / "progress")) == {0: hashlib.sha256(blob[:1000]).hexdigest()}
    with pytest.raises(AnsibleActionFail, match=r"rc 3\) with ranges \[1, 2\] of 3 not received"):
        received(rc, json.dumps(out), "", ranges_of(2500, 1000))


def test_one_stream_sends_every_range_and_reports_the_hosts_sums(tmp_path):
    blob = os.urandom(5 * MIB + 3)
    (tmp_path / "src").write_bytes(blob)
    todo = ranges_of(len(blob), MIB)
    got, whole = received(*stream(receiver_argv(tmp_path, todo, whole=True), read_ahead(str(tmp_path / "src"), todo)),
                          todo=todo)
    assert [got[i] for i in range(len(todo))] == hash_ranges(str(tmp_path / "src"), todo)[0]
    assert whole == hashlib.sha256(blob).hexdigest()  # hashed on the host as it arrived: not read again
    assert (tmp_path / "data").read_bytes() == blob
    assert read_progress(str(tmp_path / "progress")) == got


def test_an_interrupted_stream_resumes_without_sending_the_whole_ranges_again(tmp_path):
    blob = os.urandom(6 * MIB)
    (tmp_path / "src").write_bytes(blob)
    todo = ranges_of(len(blob), MIB)
    sums = hash_ranges(str(tmp_path / "src"), todo)[0]

    def until_cut(blocks):  # the controller dies in the middle of range 3
        for index, block in blocks:
            if index == 3 and block is None:
                raise KeyboardInterrupt
            yield index, block if index < 3 else block[:1000]

    with pytest.raises(KeyboardInterrupt):
        stream(receiver_argv(tmp_path, todo), until_cut(read_ahead(str(tmp_path / "src"), todo)))
    held = read_progress(str(tmp_path / "progress"))
    assert held == {i: sums[i] for i in range(3)}

    # the next run sends only the ranges the host does not hold with the controller's sum
    rest = [r for r in todo if held.get(r[0]) != sums[r[0]]]
    assert [r[0] for r in rest] == [3, 4, 5]
    sent = []

    def counted(blocks):
        for index, block in blocks:
            sent.append(len(block or b""))
            yield index, block

    got, whole = received(*stream(receiver_argv(tmp_path, rest), counted(read_ahead(str(tmp_path / "src"), rest))),
                          todo=rest)
    assert sum(sent) == 3 * MIB and got == {i: sums[i] for i in (3, 4, 5)} and whole is None
    assert (tmp_path / "data").read_bytes() == blob


class PerRange(ActionModule):
    """The action's sender on a connection with no stream: each command runs here, its bytes as in_data."""

    def __init__(self):  # pylint: disable=super-init-not-called  # no task, no connection
        self.inputs = []

    def _stream_argv(self, cmd):
        return None

    def _low_level_execute_command(self, cmd, sudoable=True, in_data=None, **_kw):
        self.inputs.append(len(in_data))
        proc = subprocess.run(cmd, shell=True, input=in_data, capture_output=True, timeout=60)
        return {"rc": proc.returncode, "stdout": proc.stdout.decode(), "stderr": proc.stderr.decode()}


def test_without_a_stream_each_range_is_one_command_with_its_bytes(tmp_path):
    blob = os.urandom(3 * MIB - 5)
    (tmp_path / "src").write_bytes(blob)
    todo = ranges_of(len(blob), MIB)[1:]
    status = {"python": sys.executable, "data": str(tmp_path / "data"), "progress": str(tmp_path / "progress")}
    action = PerRange()
    got, whole = action._send(status, str(tmp_path / "src"), todo, whole=True)
    assert action.inputs == [MIB, MIB - 5]
    assert whole is None  # no command saw the whole file: the finish hashes it
    sums = hash_ranges(str(tmp_path / "src"), ranges_of(len(blob), MIB))[0]
    assert got == {1: sums[1], 2: sums[2]}
    assert read_progress(str(tmp_path / "progress")) == got


def old_python(version):
    """A Python `version` that runs (pyenv's shim alone does not), or None."""
    pyenv = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}")))
    candidates = [shutil.which(f"python{version}"), *pyenv]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.parametrize("version", ["3.6", "2.7"])  # CentOS 7 / Kylin python3; ansible-core 2.16 targets 2.7
def test_the_receiver_runs_on_old_pythons(tmp_path, version):
    python = old_python(version)
    if not python:
        pytest.skip(f"no python{version} here")
    data = os.urandom(3 * MIB + 7)
    todo = [(0, 5, MIB), (1, 5 + MIB, len(data) - MIB)]
    proc = subprocess.run(receiver_argv(tmp_path, todo, python, whole=True), input=data, capture_output=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [r["sha256"] for r in report["ranges"]] == [
        hashlib.sha256(data[:MIB]).hexdigest(), hashlib.sha256(data[MIB:]).hexdigest()]
    assert report["whole"] == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "data").read_bytes() == bytes(5) + data


def test_the_receiver_is_python_3_6_syntax():
    import ast
    tree = ast.parse(RECEIVER)
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)], "no f-strings on Python 3.6 hosts"


def test_progress_keeps_the_last_sum_of_an_index_and_ignores_a_torn_line(tmp_path):
    path = tmp_path / "progress"
    assert read_progress(str(path)) == {}
    path.write_text(f"0 {'a' * 64}\n1 {'b' * 64}\n0 {'c' * 64}\nnonsense\n2 {'d' * 20}")
    assert read_progress(str(path)) == {0: "c" * 64, 1: "b" * 64}


def test_the_host_side_reports_what_it_holds_and_puts_the_file_in_place(module_runner, tmp_path):
    blob = os.urandom(3 * MIB + 5)
    sha = hashlib.sha256(blob).hexdigest()
    dest = tmp_path / "stage" / "images" / "big.tar"
    dest.parent.mkdir(parents=True)
    cache = tmp_path / "cache.json"
    args = {"src": "/controller/big.tar", "dest": str(dest), "sha256": sha, "chunk_mib": 1, "cache": str(cache),
            "size": len(blob)}

    check = module_runner("bundle_send", dict(args, _ansible_check_mode=True))
    assert check["in_place"] is False and check["held"] == {} and not (tmp_path / "stage" / ".parts").exists()
    status = module_runner("bundle_send", args)
    assert status["data"] == str(tmp_path / "stage" / "images" / ".parts" / sha / "data")
    assert os.path.getsize(status["data"]) == 0
    with open(status["data"], "wb") as handle:
        handle.write(blob)
    with open(status["progress"], "w") as handle:
        handle.write(f"1 {'e' * 64}\n")
    assert module_runner("bundle_send", args)["held"] == {"1": "e" * 64}

    done = module_runner("bundle_send", dict(args, phase="finish", mode="0640"))  # not hashed: reads the file
    assert done["changed"] and done["sha256"] == sha
    assert dest.read_bytes() == blob and oct(dest.stat().st_mode & 0o777) == "0o640"
    assert not (tmp_path / "stage" / "images" / ".parts" / sha).exists()
    assert json.loads(cache.read_text())[str(dest)]["sha256"] == sha  # the check of the copy reads nothing
    assert module_runner("bundle_send", args)["in_place"] is True


def test_the_scratch_can_be_elsewhere_on_the_same_file_system(module_runner, tmp_path):
    parts = tmp_path / ".parts" / ("f" * 64)
    args = {"src": "/c/x", "dest": str(tmp_path / "images" / "x"), "sha256": "f" * 64, "parts": str(parts),
            "cache": ""}
    assert module_runner("bundle_send", args)["data"] == str(parts / "data") and (parts / "data").exists()


def test_a_file_that_does_not_verify_is_dropped_naming_both_sums(module_runner, tmp_path):
    sha = "f" * 64
    dest = tmp_path / "big.tar"
    args = {"src": "/c/big.tar", "dest": str(dest), "sha256": sha, "chunk_mib": 1, "cache": ""}
    status = module_runner("bundle_send", args)
    with open(status["data"], "wb") as handle:
        handle.write(b"damaged")
    failed = module_runner("bundle_send", dict(args, phase="finish"))
    actual = hashlib.sha256(b"damaged").hexdigest()
    assert failed["failed"] and actual in failed["msg"] and sha in failed["msg"]
    assert not dest.exists() and not (tmp_path / ".parts" / sha).exists()
