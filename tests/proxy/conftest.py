"""Fixtures for the dcu-proxy tests."""

from __future__ import annotations

import pytest
from proxy.proxytools import make_proxy


@pytest.fixture
def start_proxy(tmp_path):
    """start_proxy([sim.url, ...], backend_concurrency=2, ...) -> Proxy, listening (backends may be down)."""
    started = []

    def start(backends: list[str], **settings):
        proxy = make_proxy(tmp_path, backends, **settings)
        started.append(proxy)
        return proxy.start(ready_path="/__lb_status")

    yield start
    for proxy in started:
        proxy.stop()
