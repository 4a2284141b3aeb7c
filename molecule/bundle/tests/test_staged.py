"""testinfra checks of a staged bundle (molecule/bundle): the host holds exactly the bundle, and a stage
interrupted half way resumes without sending again the ranges the host already holds."""

import json
import os
import signal
import subprocess
from pathlib import Path

from support import make_bundle, wait_until  # tests/support.py, on pytest's pythonpath

STAGE = "/var/lib/dcu-serving/bundle"
BUNDLE = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]) / "build" / "bundle"


def test_every_staged_file_matches_its_sum(host):
    check = host.run(f"cd {STAGE} && sha256sum --check --strict SHA256SUMS")
    assert check.rc == 0, check.stdout + check.stderr
    expected = json.loads((BUNDLE / "index.json").read_text())["artifacts"]
    assert check.stdout.count(": OK") == len(expected) > 0


def test_host_index_is_the_controllers(host):
    assert host.file(f"{STAGE}/index.json").content_string == (BUNDLE / "index.json").read_text()


def test_nothing_else_and_no_scratch_left(host):
    staged = set(host.run(f"cd {STAGE} && find . -type f -printf '%P\\n'").stdout.split())
    expected = {a["file"] for a in json.loads((BUNDLE / "index.json").read_text())["artifacts"]}
    assert staged == expected | {"index.json", "SHA256SUMS"}
    assert not host.file(f"{STAGE}/.parts").exists or not host.run(f"ls -A {STAGE}/.parts").stdout.strip()


def test_large_files_went_in_ranges(host):
    # the range size is 16 MiB in this scenario; the (gzipped) simulator image is larger than that
    sizes = [a["size"] for a in json.loads((BUNDLE / "index.json").read_text())["artifacts"]]
    assert max(sizes) > 16 * 1024 * 1024


# The interrupted stage: its own bundle and stage directory, so the scenario's staged bundle stays as it is.
RESUME = "/var/lib/dcu-serving/resume-test"
MIB = 1024 * 1024
# Every range travels in one stream at disk speed: enough of them that the kill lands half way.
CHUNKS = 160


def on_node(node_name, *argv):
    return subprocess.run(["docker", "exec", node_name, *argv], capture_output=True, text=True, timeout=60)


def test_an_interrupted_stage_resumes_without_sending_ranges_again(tmp_path, node_name, start_playbook,
                                                                   kill_playbook, run_playbook):
    # ranges of 1 MiB (the last one short), random so that no range equals another
    artifact = make_bundle(tmp_path / "bundle", {"images/big.tar.gz": os.urandom(CHUNKS * MIB - 12345)},
                           kind="image")[0]
    # dcu.serving.bundle_send records each range the host holds, once written and synced, in this file
    progress = f"{RESUME}/.parts/{artifact['sha256']}/progress-{MIB}"
    indices = set(range(CHUNKS))
    extra = {"dcu_bundle_dir": str(tmp_path / "bundle"), "dcu_bundle_stage_dir": RESUME,
             "dcu_bundle_stage_chunk_mib": 1}

    def ranges_on_node():
        lines = on_node(node_name, "cat", progress).stdout
        return {int(line.split()[0]) for line in lines.splitlines() if len(line.split()) == 2} & indices

    try:
        first = start_playbook("stage.yml", extra_vars=extra)
        try:
            wait_until(lambda: first.poll() is not None or len(ranges_on_node()) >= 2, timeout=180, interval=0.1,
                       what=f"2 ranges in {progress}")
        finally:
            kill_playbook(first)
        assert first.returncode == -signal.SIGKILL, f"the stage ended on its own (rc {first.returncode})"
        # A command the killed run had started on the node finishes there (docker exec does not stop it; a
        # receiver cut short records nothing); every command Ansible runs ends in `sleep 0`.
        wait_until(lambda: on_node(node_name, "pgrep", "-f", "sleep [0]").returncode == 1, timeout=60,
                   interval=0.1, what="the killed run's commands on the node to end")
        before = ranges_on_node()
        assert 2 <= len(before) < CHUNKS, f"ranges on the host after the interruption: {sorted(before)}"

        rc, output = run_playbook("stage.yml", extra_vars=extra, env={"ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"})
        assert rc == 0, output[-3000:]
        report, _ = json.JSONDecoder().raw_decode(output[output.index("{"):])
        sends = [task["hosts"]["node"] for play in report["plays"] for task in play["tasks"]
                 if task["task"]["name"].endswith("Send the large artifacts the host lacks, range by range")]
        assert len(sends) == 1, f"one send task expected, got {len(sends)}"
        assert [r["item"]["file"] for r in sends[0]["results"]] == [artifact["file"]]
        ranges = {r["index"]: r["status"] for r in sends[0]["results"][0]["ranges"]}
        assert set(ranges) == indices
        assert {i for i, status in ranges.items() if status == "present"} == before, "ranges the host held were sent"
        assert {i for i, status in ranges.items() if status == "sent"} == indices - before
        assert sorted(sends[0]["results"][0]["sent"]) == sorted(indices - before)

        staged = on_node(node_name, "sha256sum", f"{RESUME}/{artifact['file']}")
        assert staged.stdout.split()[:1] == [artifact["sha256"]], staged.stdout + staged.stderr
        left = on_node(node_name, "find", RESUME, "-path", "*/.parts/*")
        assert left.returncode == 0 and left.stdout == "", f"scratch left behind: {left.stdout}"
    finally:
        on_node(node_name, "rm", "-rf", RESUME)
