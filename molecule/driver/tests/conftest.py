"""Helpers for the driver scenario's checks: run the real playbook against one node, as an operator would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
DRIVERS_PLAYBOOK = PROJECT / "playbooks" / "drivers.yml"
BUNDLE = PROJECT / "build" / "bundle"
DRIVER_VERSION = "6.3.30-V1.4.1a"
SYSFS = "/run/dcu-emu/sys"


def _run_drivers(host: str, *args: str, extra_vars: dict | None = None, timeout: int = 600):
    """ansible-playbook playbooks/drivers.yml on one node of the scenario; returns (rc, output)."""
    inventory = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
    argv = [shutil.which("ansible-playbook") or "ansible-playbook", "-i", str(inventory),
            str(DRIVERS_PLAYBOOK), "-l", host, "-e", json.dumps({"dcu_hosts": host, **(extra_vars or {})}), *args]
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=PROJECT)
    return proc.returncode, proc.stdout + proc.stderr


def _recap(output: str, host: str) -> dict:
    """{'ok': N, 'changed': N, 'failed': N, ...} from the PLAY RECAP line of `host`."""
    for line in output.splitlines():
        if line.startswith(host + " ") and "ok=" in line:
            return {k: int(v) for k, v in (field.split("=") for field in line.split(":", 1)[1].split())}
    raise AssertionError(f"no PLAY RECAP line for {host} in:\n{output[-3000:]}")


def _module(host, name: str, **args):
    """Run a dcu.serving module on the node through Ansible (testinfra); failures are returned, not raised.

    The result file of `ansible --tree` may lack the "failed" key, so tests assert on what the module
    reports (msg, problems), not on that flag.
    """
    try:
        return host.ansible(name, " ".join(f"{k}={v}" for k, v in args.items()), check=False, become=True)
    except host.ansible.AnsibleException as exc:
        return exc.result


@pytest.fixture(scope="session")
def bundle_dir():
    """The scenario's bundle on the controller (make bundle)."""
    return BUNDLE


@pytest.fixture(scope="session")
def bundle_index():
    return json.loads((BUNDLE / "index.json").read_text())


@pytest.fixture(scope="session")
def run_drivers():
    """run_drivers("legacy", "--check", extra_vars={...}) -> (rc, output) of playbooks/drivers.yml."""
    return _run_drivers


@pytest.fixture(scope="session")
def recap():
    """recap(output, "legacy") -> the PLAY RECAP counters of that host."""
    return _recap


@pytest.fixture(scope="session")
def dcu_module():
    """dcu_module(host, "dcu.serving.dcu_facts", sysfs_root=...) -> the module's result."""
    return _module
