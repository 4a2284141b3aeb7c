"""cluster_health with `units`: a unit that has settled failed (failed, stopped, not installed, restarting
again and again) fails the check at once, naming it, its state, the command that shows why and its journal's
last lines; a unit still starting is waited for and reported as such. systemctl and journalctl are small
executables on PATH that answer from a table, as systemd 252 prints them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ansible_collections.dcu.serving.plugins.modules.cluster_health import parse_show, unit_state
from support import REPO

# systemctl show vllm@0 vllm@3 dcu-proxy on the emulated node: blocks in the order asked, properties in
# systemd's own order.
SHOW = """Id=vllm@0.service
Result=success
NRestarts=0
StateChangeTimestampMonotonic=81234567
LoadState=loaded
ActiveState=active
SubState=running

Id=vllm@3.service
Result=exit-code
NRestarts=1
StateChangeTimestampMonotonic=90000000
LoadState=loaded
ActiveState=activating
SubState=auto-restart

Id=dcu-proxy.service
Result=success
NRestarts=0
StateChangeTimestampMonotonic=80000000
LoadState=loaded
ActiveState=active
SubState=running
"""


def props(active, sub, result="success", restarts=0, load="loaded", since=None):
    return {"LoadState": load, "ActiveState": active, "SubState": sub, "Result": result,
            "NRestarts": str(restarts), "StateChangeTimestampMonotonic": str(int((since or 0) * 1e6))}


def test_parse_show_keys_each_block_by_unit_name():
    shown = parse_show(SHOW)
    assert sorted(shown) == ["dcu-proxy", "vllm@0", "vllm@3"]
    assert shown["vllm@3"]["SubState"] == "auto-restart" and shown["vllm@3"]["NRestarts"] == "1"


@pytest.mark.parametrize(("unit_props", "state", "words"), [
    (props("active", "running"), "active", ["active (running)"]),
    (props("activating", "start-post", since=100), "starting", ["activating (start-post) for 12s"]),
    (props("deactivating", "stop-sigterm"), "starting", ["deactivating (stop-sigterm)"]),
    # failed once, systemd starts it again: waited for
    (props("activating", "auto-restart", "exit-code", restarts=0), "starting", ["restarting after a failure"]),
    # failed twice since it was started by hand: a restart loop
    (props("activating", "auto-restart", "exit-code", restarts=1), "failed",
     ["keeps failing", "2 failures", "Result=exit-code", "journalctl -u vllm@3 -n 50"]),
    (props("failed", "failed", "exit-code", restarts=5), "failed",
     ["failed (Result=exit-code, 5 restarts)", "journalctl -u vllm@3 -n 50",
      "once fixed: systemctl reset-failed vllm@3 && systemctl start vllm@3"]),
    (props("inactive", "dead"), "failed", ["is stopped (inactive/dead)", "systemctl start vllm@3"]),
    (props("inactive", "dead", load="not-found"), "failed", ["not installed", "playbooks/serving.yml"]),
])
def test_unit_state(unit_props, state, words):
    verdict = unit_state("vllm@3", unit_props, failures=2, now=112.5)
    assert verdict["state"] == state, verdict
    for word in words:
        assert word in verdict["why"], verdict["why"]


def test_a_higher_unit_failures_waits_longer_for_a_restarting_unit():
    restarting = props("activating", "auto-restart", "exit-code", restarts=1)
    assert unit_state("vllm@3", restarting, failures=3)["state"] == "starting"
    assert unit_state("vllm@3", restarting, failures=2)["state"] == "failed"


FAKE_SYSTEMD = """#!{python}
# systemctl show / journalctl -u from {table}; the n-th systemctl call answers from the n-th entry (the
# last one from then on), so a unit can change its state between polls.
import json, os, sys
table = json.load(open({table!r}))
if os.path.basename(sys.argv[0]) == "journalctl":
    unit = sys.argv[1].split("=", 1)[1]  # _SYSTEMD_UNIT=vllm@3.service: what the unit's processes logged
    print("\\n".join(table["journal"].get(unit, [])))
    sys.exit(0)
calls = {table!r} + ".calls"
n = int(open(calls).read()) if os.path.exists(calls) else 0
open(calls, "w").write(str(n + 1))
states = table["show"][min(n, len(table["show"]) - 1)]
blocks = []
for unit in [a for a in sys.argv[2:] if not a.startswith("--")]:
    active, sub, result, restarts = states.get(unit, ["active", "running", "success", 0])
    blocks.append("Id=%s.service\\nResult=%s\\nNRestarts=%s\\nLoadState=loaded\\nActiveState=%s\\nSubState=%s"
                  % (unit, result, restarts, active, sub))
print("\\n\\n".join(blocks))
"""


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    """fake_systemd([{unit: [active, sub, result, restarts]}, ...], journal={unit: [lines]}): systemctl and
    journalctl first on PATH."""
    def install(show, journal=None):
        table = tmp_path / "systemd.json"
        table.write_text(json.dumps({"show": show, "journal": journal or {}}))
        bin_dir = tmp_path / "systemd-bin"
        bin_dir.mkdir(exist_ok=True)
        for name in ("systemctl", "journalctl"):
            (bin_dir / name).write_text(FAKE_SYSTEMD.format(python=sys.executable, table=str(table)))
            (bin_dir / name).chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        return table
    return install


UNITS = [f"vllm@{card}" for card in range(8)] + ["dcu-proxy"]


def lb_status(healthy):
    return (200, {"healthy": healthy, "total": 8, "backends": [
        {"url": f"http://127.0.0.1:{8002 + card}", "healthy": card < healthy, "active": 0, "last_error": None}
        for card in range(8)]})


def test_a_unit_that_keeps_failing_fails_the_check_at_once(module_runner, http_server, fake_systemd):
    fake_systemd([{"vllm@3": ["activating", "auto-restart", "exit-code", 2]}], journal={"vllm@3.service": [
        "docker: Error response from daemon: No such image: dcu-serving/absent:0.", "See 'docker run --help'."]})
    proxy = http_server({"/__lb_status": lb_status(7)})
    started = time.monotonic()
    result = module_runner("cluster_health", {"url": proxy.url, "expected": 8, "timeout": 60, "units": UNITS})
    assert time.monotonic() - started < 10
    assert result.get("failed"), result
    msg = result["msg"]
    assert msg.startswith("1 of 9 units failed"), msg
    assert "vllm@3 keeps failing - 3 failures" in msg and "journalctl -u vllm@3 -n 50" in msg
    assert "No such image: dcu-serving/absent:0." in msg
    assert [u["unit"] for u in result["units"] if u["state"] == "failed"] == ["vllm@3"]
    assert proxy.seen == []  # the units are read first: a failed one needs no HTTP


def test_a_stopped_proxy_is_named_rather_than_its_silence(module_runner, fake_systemd):
    fake_systemd([{"dcu-proxy": ["inactive", "dead", "success", 0]}])
    result = module_runner("cluster_health", {"url": "http://127.0.0.1:9", "timeout": 60, "units": UNITS})
    assert result.get("failed") and "dcu-proxy is stopped (inactive/dead) - systemctl start dcu-proxy" in result["msg"]


def test_a_starting_unit_is_waited_for_and_reported(module_runner, http_server, fake_systemd):
    table = fake_systemd([{"vllm@3": ["activating", "start-post", "success", 0]}])
    proxy = http_server({"/__lb_status": lb_status(7)})
    result = module_runner("cluster_health", {"url": proxy.url, "expected": 8, "timeout": 60, "interval": 0.1,
                                              "report_every": 0.5, "units": UNITS})
    assert not result.get("failed"), result
    assert result["waiting"][0].startswith("vllm@3 activating (start-post)"), result["waiting"]
    assert result["waiting"][-1] == "7/8 healthy behind the proxy"
    assert int((table.parent / "systemd.json.calls").read_text()) > 1  # polled, not answered from one look


def test_a_starting_unit_that_fails_ends_the_wait_when_it_fails(module_runner, http_server, fake_systemd):
    starting = {"vllm@3": ["activating", "start-post", "success", 0]}
    fake_systemd([starting, starting, starting, {"vllm@3": ["failed", "failed", "timeout", 0]}])
    proxy = http_server({"/__lb_status": lb_status(7)})
    result = module_runner("cluster_health", {"url": proxy.url, "expected": 8, "timeout": 60, "interval": 0.1,
                                              "units": UNITS})
    assert result.get("failed") and "vllm@3 failed (Result=timeout, 0 restarts)" in result["msg"], result
    assert len(proxy.seen) == 3


def test_a_drained_backend_whose_unit_starts_is_waited_for(module_runner, http_server, fake_systemd):
    """A rolling restart at work: vllm@3 drained and restarting. It undrains once vllm@3 serves: wait."""
    fake_systemd([{"vllm@3": ["activating", "start-post", "success", 0]}])
    code, status = lb_status(8)
    for backend in status["backends"]:
        backend["draining"] = backend["url"].endswith(":8005")
    proxy = http_server({"/__lb_status": (code, status)})
    result = module_runner("cluster_health", {"url": proxy.url, "expected": 8, "timeout": 60, "interval": 0.1,
                                              "report_every": 0.5, "units": UNITS})
    assert not result.get("failed"), result
    assert result["waiting"] == [result["waiting"][0], "7/8 healthy behind the proxy"], result["waiting"]
    assert result["waiting"][0].startswith("vllm@3 activating (start-post)"), result["waiting"]


def test_units_still_starting_at_the_timeout_are_named(module_runner, http_server, fake_systemd):
    fake_systemd([{"vllm@3": ["activating", "start-post", "success", 0]}])
    proxy = http_server({"/__lb_status": lb_status(7)})
    result = module_runner("cluster_health", {"url": proxy.url, "expected": 8, "timeout": 0.5, "interval": 0.1,
                                              "units": UNITS})
    assert result.get("failed") and "vllm@3 still activating (start-post)" in result["msg"], result


def test_the_playbook_prints_progress_then_fails_naming_the_unit(tmp_path, http_server, fake_systemd):
    """Through ansible-playbook: the action plugin prints what is awaited between the module's slices."""
    starting = {"vllm@3": ["activating", "auto-restart", "exit-code", 0]}
    fake_systemd([starting] * 6 + [{"vllm@3": ["activating", "auto-restart", "exit-code", 1]}])
    proxy = http_server({"/__lb_status": lb_status(7)})
    playbook = tmp_path / "wait.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"dcu.serving.cluster_health": {"url": proxy.url, "expected": 8, "timeout": 60, "interval": 0.2,
                                        "report_every": 0.5, "units": UNITS}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    bin_dir = os.path.dirname(sys.executable)
    proc = subprocess.run([os.path.join(bin_dir, "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(playbook)], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode != 0, proc.stdout
    assert "localhost: waiting" in proc.stderr and "vllm@3 restarting after a failure" in proc.stderr, proc.stderr
    assert "vllm@3 keeps failing - 2 failures" in proc.stdout, proc.stdout


def test_a_restart_loop_is_seen_between_two_slow_polls(module_runner, http_server, fake_systemd):
    """A unit looping through start (activating) and RestartSec (auto-restart): the units are read every 0.5 s
    while one starts, so an auto-restart state shorter than the 2 s interval is not stepped over."""
    starting = {"vllm@3": ["activating", "start-post", "success", 1]}
    between = {"vllm@3": ["activating", "auto-restart", "exit-code", 1]}
    fake_systemd([starting, between, starting, starting, starting, starting, starting, starting])
    proxy = http_server({"/__lb_status": lb_status(7)})
    started = time.monotonic()
    result = module_runner("cluster_health", {"url": proxy.url, "expected": 8, "timeout": 30, "interval": 2,
                                              "units": UNITS})
    assert result.get("failed") and "vllm@3 keeps failing - 2 failures" in result["msg"], result
    assert time.monotonic() - started < 2


def test_a_unit_in_start_post_is_awaited_although_the_proxy_already_counts_it(module_runner, http_server,
                                                                              fake_systemd):
    """The readiness waiter (ExecStartPost) runs while /health already answers: 8/8 behind the proxy is not
    done until the unit is active, and a unit still starting at the timeout fails the check."""
    starting = {"vllm@2": ["activating", "start-post", "success", 0]}
    table = fake_systemd([starting, starting, {}])
    proxy = http_server({"/__lb_status": lb_status(8)})
    result = module_runner("cluster_health", {"url": proxy.url, "expected": 8, "timeout": 30, "units": UNITS})
    assert not result.get("failed"), result
    assert result["summary"] == "8/8" and int((table.parent / "systemd.json.calls").read_text()) == 3
    assert all(u["state"] == "active" for u in result["units"])

    (table.parent / "systemd.json.calls").unlink()
    fake_systemd([starting])
    result = module_runner("cluster_health", {"url": proxy.url, "expected": 8, "timeout": 0.3, "units": UNITS})
    assert result.get("failed") and "vllm@2 still activating (start-post)" in result["msg"], result
