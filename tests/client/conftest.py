"""A real service for the client tests: dcu-proxy in front of simulators, all as subprocesses."""

from __future__ import annotations

import pytest

from support import FAST_HEALTH, FAST_SIM, Proxy


@pytest.fixture
def service(start_sim, start_proxy) -> Proxy:
    """Two simulated cards behind the proxy, both healthy."""
    sims = [start_sim(*FAST_SIM) for _ in range(2)]
    return start_proxy([s.url for s in sims], healthy=2, health=FAST_HEALTH)
