"""Helpers for the rag scenario: playbooks as an operator runs them, the proxy from the controller
(molecule/_shared/testkit.py, shared with the other serving scenarios)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_shared"))
from testkit import (  # noqa: F401  (molecule/_shared, put on the path above: fixtures for the tests)
    dcu_module,
    image_file,
    node_name,
    proxy_url,
    recap_fixture,
    run_playbook_fixture,
    unit_fixture,
)
