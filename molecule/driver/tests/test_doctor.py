"""playbooks/doctor.yml on the converged node, as an operator runs it: nothing fails on a healthy host; a
service user taken out of its device group and a stopped hymgr are named, each with its fix. The node has
no proxy venv (the driver scenario installs no dcu-serving), so the playbook ships the collection's doctor
as a zipapp: the path every driver-only host takes."""

from __future__ import annotations

import json

import testkit  # molecule/_shared, on the path through conftest.py

from support import wait_until  # tests/support.py, on pytest's pythonpath

testinfra_hosts = ["node"]


def doctor(host_name: str = "node") -> tuple[int, dict, str]:
    """(exit status, the node's dcu-doctor JSON, the whole output) of playbooks/doctor.yml on one node."""
    rc, output = testkit.run_playbook("doctor.yml", "-l", host_name, extra_vars={"dcu_hosts": host_name},
                                      env={"ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}, timeout=300)
    # The callback's JSON document, then whatever ansible-playbook wrote to stderr.
    document, _end = json.JSONDecoder().raw_decode(output[output.find("{"):])
    tasks = [task for play in document["plays"] for task in play["tasks"]]
    [read] = [task["hosts"][host_name] for task in tasks if task["task"]["name"] == "Read the findings"]
    return rc, read["ansible_facts"]["__doctor"], output


def failures(report: dict) -> dict:
    return {f["message"]: f["fix"] for f in report["checks"] if f["status"] == "fail"}


def wait_for_hy_smi(host, timeout: float = 60):
    wait_until(lambda: host.run("/opt/hyhal/bin/hy-smi --showdriverversion").rc == 0, timeout, interval=0.5,
               what="hy-smi answering after hymgr started")


def test_the_doctor_finds_nothing_wrong_on_the_converged_node(host):
    rc, report, output = doctor()
    assert rc == 0 and report["ok"], output
    statuses = {f["check"]: f["status"] for f in report["checks"]}
    for check in ("driver", "hymgr", "device nodes", "versions"):
        assert statuses[check] == "ok", report["report"]
    # A driver-only host: the serving parts are not installed, which is no failure.
    assert statuses["proxy"] == "skip" and statuses["images"] == "skip"


def test_the_doctor_names_a_removed_group_membership_and_a_stopped_hymgr_with_their_fixes(host):
    with host.sudo():
        host.run_expect([0], "gpasswd -d dcu-batch render")
        host.run_expect([0], "systemctl stop hymgr")
    try:
        rc, report, output = doctor()
        assert rc == 2, output  # ansible-playbook: a host failed
        found = failures(report)
        assert found.get("hymgr.service is inactive: hy-smi answers nothing without it", "").startswith(
            "systemctl start hymgr"), report["report"]
        [membership] = [m for m in found if m.startswith("dcu-batch is not in group render, which owns /dev/kfd")]
        assert found[membership] == ("usermod -aG render dcu-batch (then restart its services), "
                                     "or run playbooks/drivers.yml")
        # The play's failure message carries both, with their fixes.
        assert "Fix: usermod -aG render dcu-batch" in output and "Fix: systemctl start hymgr" in output
    finally:
        with host.sudo():
            host.run_expect([0], "usermod -aG render dcu-batch")
            host.run_expect([0], "systemctl start hymgr")
        wait_for_hy_smi(host)
    assert "render" in host.user("dcu-batch").groups
