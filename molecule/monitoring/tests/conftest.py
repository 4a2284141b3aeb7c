"""Helpers for the monitoring scenario: playbooks as an operator runs them (molecule/_shared/testkit.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
from testkit import (  # noqa: F401  (molecule/_shared, put on the path above: fixtures for the tests)
    recap_fixture,
    run_playbook_fixture,
    unit_fixture,
)
