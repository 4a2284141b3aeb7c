"""Changes roll across hosts `dcu_serial` at a time, and a failed host stops the rest: a real ansible-playbook
run of each changing playbook on three local hosts that all fail the role's first check, so which hosts ran
shows how the play was batched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLLING = ["drivers.yml", "serving.yml", "rolling_restart.yml"]


def hosts_that_ran(tmp_path: Path, playbook: str, *extra: str) -> list[str]:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"dcu_nodes": {
        "hosts": {"a": {}, "b": {}, "c": {}},
        # local and unprivileged: every host fails at the role's first check, before touching anything
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "ansible_become": False}}}}}))
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory),
         str(REPO / "playbooks" / playbook), *extra],
        capture_output=True, text=True, cwd=REPO, timeout=120,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                 # drivers.yml gathers facts; keep it from reading this machine for long
                 ANSIBLE_GATHER_TIMEOUT="10"))
    assert done.returncode != 0, "every host was meant to fail its first check"
    stats = json.loads(done.stdout)["stats"]
    return sorted(host for host, s in stats.items() if s["failures"] or s["ok"])


@pytest.mark.parametrize("playbook", ROLLING)
def test_one_host_at_a_time_and_a_failure_stops_the_rest(tmp_path, playbook):
    assert hosts_that_ran(tmp_path, playbook) == ["a"]


@pytest.mark.parametrize("playbook", ROLLING)
def test_dcu_serial_widens_the_batch(tmp_path, playbook):
    assert hosts_that_ran(tmp_path, playbook, "-e", "dcu_serial=2") == ["a", "b"]
    assert hosts_that_ran(tmp_path, playbook, "-e", "dcu_serial=0", "-e", "dcu_max_fail_percentage=100") \
        == ["a", "b", "c"]
