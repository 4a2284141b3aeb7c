"""Helpers for the platform scenario: playbooks as an operator runs them, the proxy from the controller."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
import testkit  # molecule/_shared, put on the path above
from testkit import dcu_module, recap_fixture  # noqa: F401  (fixtures for the tests)

SCENARIO = os.environ.get("MOLECULE_SCENARIO_NAME", "platform")


def _unit_property(host, unit: str, prop: str) -> str:
    return host.check_output(f"systemctl show --property={prop} --value {unit}")


@pytest.fixture(scope="session")
def node_name():
    return f"dcu-mol-{SCENARIO}-node"


@pytest.fixture(scope="session")
def proxy_url(node_name):
    """The proxy as a business caller reaches it: the node's address, port 8000."""
    address = subprocess.run(["docker", "inspect", "--format", "{{.NetworkSettings.IPAddress}}", node_name],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert address, f"{node_name} has no address on Docker's bridge"
    return f"http://{address}:8000"


@pytest.fixture
def image_file(tmp_path):
    """A small real PNG (a receipt-like white page with a dark bar)."""
    from PIL import Image, ImageDraw

    path = tmp_path / "page.png"
    page = Image.new("RGB", (320, 240), "white")
    ImageDraw.Draw(page).rectangle((20, 20, 300, 60), fill="black")
    page.save(path)
    return path


@pytest.fixture(scope="session")
def run_playbook():
    """run_playbook("serving.yml", "--check", extra_vars={...}) -> (rc, output)."""
    return testkit.run_playbook


@pytest.fixture(scope="session")
def unit():
    """unit(host, "vllm@5", "NRestarts") -> a systemd property of the unit."""
    return _unit_property
