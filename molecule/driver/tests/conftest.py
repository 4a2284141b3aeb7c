"""Helpers for the driver scenario's checks: run the real playbook against one node, as an operator would."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
import testkit  # molecule/_shared, put on the path above
from testkit import dcu_module, recap_fixture  # noqa: F401  (fixtures for the tests)

BUNDLE = testkit.PROJECT / "build" / "bundle"
DRIVER_VERSION = "6.3.30-V1.4.1a"
SYSFS = "/run/dcu-emu/sys"


def _run_drivers(host: str, *args: str, extra_vars: dict | None = None, timeout: int = 600):
    """ansible-playbook playbooks/drivers.yml on one node of the scenario; returns (rc, output)."""
    return testkit.run_playbook("drivers.yml", "-l", host, *args, extra_vars={"dcu_hosts": host, **(extra_vars or {})},
                        timeout=timeout)


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
