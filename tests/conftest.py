"""Fixtures shared by every test package."""

from __future__ import annotations

import json

import pytest

from support import SERVED_MODEL, Proxy, ServerProcess, free_port, make_proxy, python_module, wait_until


@pytest.fixture
def start_sim(tmp_path):
    """Start dcu-vllm-sim subprocesses: start_sim("--sim-itl-ms", "5") -> ServerProcess (ready)."""
    started: list[ServerProcess] = []

    def start(*extra: str, port: int | None = None, wait: bool = True, env: dict | None = None,
              served_model_name: str = SERVED_MODEL, model_config: dict | None = None) -> ServerProcess:
        port = port or free_port()
        model_dir = tmp_path / "models" / served_model_name  # like vLLM, the sim needs a model dir
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "config.json").write_text(json.dumps(model_config or {"architectures": ["MiniCPMV"]}))
        (model_dir / "tokenizer_config.json").write_text("{}")  # a real model directory has its tokenizer
        args = python_module(
            "dcu_serving.sim", "serve", str(model_dir), "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", served_model_name, *extra,
        )
        server = ServerProcess(args, port, env=env or {}, log=tmp_path / f"sim-{port}.log")
        started.append(server)
        return server.start(ready_path="/health" if wait else None)

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def start_proxy(tmp_path):
    """start_proxy([sim.url, ...], healthy=N, backend_concurrency=2, ...) -> Proxy, listening.

    Backends may be down; with `healthy`, wait until the proxy counts that many healthy backends.
    """
    started: list[Proxy] = []

    def start(backends: list[str], healthy: int | None = None, **settings) -> Proxy:
        proxy = make_proxy(tmp_path, backends, **settings)
        started.append(proxy)
        proxy.start(ready_path="/__lb_status")
        if healthy is not None:
            wait_until(lambda: proxy.lb_status()["healthy"] >= healthy, 15, what=f"{healthy} healthy backends")
        return proxy

    yield start
    for proxy in started:
        proxy.stop()
