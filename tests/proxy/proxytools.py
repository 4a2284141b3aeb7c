"""Helpers for the dcu-proxy tests: the proxy as a real subprocess, requests, SSE, the results log."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import requests
import yaml

from support import SERVED_MODEL, ServerProcess, free_port, python_module, wait_until

# Simulator timing for tests: short thinking and answers, milliseconds per token.
FAST = ("--sim-ttft-ms", "5", "--sim-itl-ms", "2", "--sim-itl-jitter", "0",
        "--sim-think-tokens", "0", "--sim-answer-tokens", "10", "--max-num-seqs", "4")


def slow(itl_ms: float = 50, tokens: int = 40) -> tuple:
    """Simulator arguments for requests that take about itl_ms * tokens."""
    return ("--sim-ttft-ms", "5", "--sim-itl-ms", str(itl_ms), "--sim-itl-jitter", "0",
            "--sim-think-tokens", "0", "--sim-answer-tokens", str(tokens), "--max-num-seqs", "4")


def body(text: str = "Read the invoice number.", **extra) -> dict:
    return {"model": SERVED_MODEL, "user": "10001", "messages": [{"role": "user", "content": text}],
            "chat_template_kwargs": {"enable_thinking": False}, **extra}


def start_sims(start_sim, count: int, *args: str) -> list[ServerProcess]:
    """Start `count` simulators in parallel and wait for all of them."""
    sims = [start_sim(*args, wait=False) for _ in range(count)]
    for sim in sims:
        sim.wait_ready()
    return sims


class Proxy(ServerProcess):
    """dcu-proxy started from a YAML file as `python -m dcu_serving.proxy --config FILE`."""

    config_path: Path
    results_path: Path
    admin_port: int

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def chat(self, payload, timeout: float = 30, headers: dict | None = None, **kw) -> requests.Response:
        data = payload if isinstance(payload, (str, bytes)) else json.dumps(payload)
        return requests.post(self.url + "/v1/chat/completions", data=data, timeout=timeout,
                             headers={"Content-Type": "application/json", **(headers or {})}, **kw)

    def lb_status(self) -> dict:
        return requests.get(self.url + "/__lb_status", timeout=5).json()

    def backend(self, sim: ServerProcess) -> dict:
        return next(b for b in self.lb_status()["backends"] if b["url"] == sim.url)

    def results(self, count: int | None = None, timeout: float = 5) -> list[dict]:
        """The results log's records; with `count`, wait until that many are written."""
        def read():
            if not self.results_path.exists():
                return []
            text = self.results_path.read_text()
            assert text == "" or text.endswith("\n"), "the results log ends with a partial line"
            return [json.loads(line) for line in text.splitlines()]

        if count is not None:
            wait_until(lambda: len(read()) >= count, timeout, what=f"{count} lines in the results log")
        return read()

    def rewrite_config(self, **settings):
        config = yaml.safe_load(self.config_path.read_text())
        config.update(settings)
        self.config_path.write_text(yaml.safe_dump(config))

    def signal(self, sig: int = signal.SIGHUP):
        self.proc.send_signal(sig)


def make_proxy(tmp_path: Path, backends: list[str], **settings) -> Proxy:
    port = free_port()
    admin_port = free_port()
    results = tmp_path / f"results-{port}.jsonl"
    config = {"listen": f"127.0.0.1:{port}", "backends": backends, "models": [SERVED_MODEL],
              "results_log": str(results), "admin": {"listen": f"127.0.0.1:{admin_port}"},
              "health": {"interval": 0.5, "timeout": 0.4}, **settings}
    path = tmp_path / f"proxy-{port}.yml"
    path.write_text(yaml.safe_dump(config))
    proxy = Proxy(python_module("dcu_serving.proxy", "--config", str(path)), port,
                  log=tmp_path / f"proxy-{port}.log")
    proxy.config_path = path
    proxy.results_path = results
    proxy.admin_port = admin_port
    return proxy


def sse(response: requests.Response) -> list:
    """The `data:` payloads of a stream: dicts, and the string "[DONE]"."""
    events = []
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events
