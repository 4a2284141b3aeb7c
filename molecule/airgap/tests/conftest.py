"""Helpers for the airgap scenario: playbooks as an operator runs them (molecule/_shared/testkit.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # proxycalls (pytest imports tests by path only)
import testkit  # molecule/_shared, put on the path above
from testkit import recap_fixture  # noqa: F401  (the recap fixture for the tests)


@pytest.fixture(scope="session")
def run_playbook():
    """run_playbook("serving.yml", "--limit", "air-host", extra_vars={...}) -> (rc, output)."""
    return testkit.run_playbook
