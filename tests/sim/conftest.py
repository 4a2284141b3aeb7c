"""Fixtures for the simulator tests."""

from __future__ import annotations

import pytest

from support import FAST_SIM


@pytest.fixture
def sim(start_sim):
    """A fast simulator: 4096-token context, at most 2 images per prompt."""
    return start_sim(*FAST_SIM, "--max-model-len", "4096", "--limit-mm-per-prompt", '{"image": 2}')
