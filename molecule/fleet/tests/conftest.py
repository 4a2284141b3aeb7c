"""Helpers for the fleet scenario: playbooks as the operator runs them, the recap they print."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
import testkit  # molecule/_shared, put on the path above
from testkit import recap_fixture  # noqa: F401  (a fixture for the tests)


@pytest.fixture(scope="session")
def run_playbook():
    """run_playbook("gateway.yml", "--check", extra_vars={...}) -> (rc, output)."""
    return testkit.run_playbook
