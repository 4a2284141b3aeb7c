"""A real service for the client tests: dcu-proxy in front of simulators, all as subprocesses."""

from __future__ import annotations

import json

import pytest
import yaml
from client.kit import FAST, Service

from support import SERVED_MODEL, ServerProcess, free_port, python_module, wait_until


@pytest.fixture
def start_proxy(tmp_path):
    started: list[ServerProcess] = []

    def start(backend_urls: list[str], wait_healthy: int | None = None, **settings) -> Service:
        port = free_port()
        results_log = tmp_path / f"results-{port}.jsonl"
        config = {
            "listen": f"127.0.0.1:{port}",
            "backends": backend_urls,
            "models": [SERVED_MODEL],
            "results_log": str(results_log),
            "health": {"interval": 0.2, "timeout": 0.2},
            "admin": {"listen": f"127.0.0.1:{free_port()}"},
            **settings,
        }
        path = tmp_path / f"proxy-{port}.yml"
        path.write_text(yaml.safe_dump(config))
        proxy = ServerProcess(python_module("dcu_serving.proxy", "--config", str(path)), port,
                              log=tmp_path / f"proxy-{port}.log")
        started.append(proxy)
        proxy.start(ready_path=None)
        service = Service(proxy, backend_urls, results_log)
        expected = len(backend_urls) if wait_healthy is None else wait_healthy

        def ready():
            if proxy.proc.poll() is not None:
                raise RuntimeError(f"dcu-proxy exited {proxy.proc.returncode}: {proxy.tail()}")
            return _healthy(service) >= expected

        wait_until(ready, 15, what=f"{expected} healthy backends")
        return service

    yield start
    for proxy in started:
        proxy.stop()


def _healthy(service: Service) -> int:
    import urllib.request

    try:
        with urllib.request.urlopen(service.url + "/__lb_status", timeout=1) as r:
            return json.loads(r.read())["healthy"]
    except OSError:
        return -1


@pytest.fixture
def service(start_sim, start_proxy) -> Service:
    """Two simulated cards behind the proxy, both healthy."""
    sims = [start_sim(*FAST) for _ in range(2)]
    return start_proxy([s.url for s in sims])
