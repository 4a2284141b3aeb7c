"""Helpers shared by the tests: free ports, real subprocesses, polling with a deadline."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parent.parent
SERVED_MODEL = "MiniCPM-V-4.5"
# Simulator timing for tests: a little thinking, a short answer, milliseconds per token.
FAST_SIM = ("--sim-ttft-ms", "5", "--sim-itl-ms", "2", "--sim-itl-jitter", "0",
            "--sim-think-tokens", "12", "--sim-answer-tokens", "10")
# Proxy health checks quick enough for tests that wait for a card to be ejected or re-admitted.
FAST_HEALTH = {"interval": 0.2, "timeout": 0.2}


def _port_range() -> range:
    """This process's ports: below the kernel's ephemeral range, split between pytest-xdist's workers."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # Linux's default
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    index = int(worker) if worker.isdigit() else 0
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), index + 1)
    size = (ephemeral_low - 10000) // count
    return range(10000 + index * size, 10000 + (index + 1) * size)


_PORTS = _port_range()
_next_port = random.randrange(_PORTS.start, _PORTS.stop)  # runs one after another start at different ports


def free_port() -> int:
    """A port nothing listens on, for a server a test is about to start. Not one the kernel picks (bind to 0): the
    kernel hands such ports out again as the local port of any outgoing connection, which took one before its
    server bound it (EADDRINUSE, seen in CI with parallel workers). Ports below the ephemeral range are only taken
    by a bind that names them; each xdist worker has its own share and walks it in turn, so no two handed-out
    ports are the same until it wraps."""
    global _next_port
    for _ in range(len(_PORTS)):
        port = _next_port
        _next_port = _PORTS.start + (port + 1 - _PORTS.start) % len(_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # a server from an earlier test, or a port in TIME_WAIT
            return port
    raise RuntimeError(f"no free port in {_PORTS}")


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll `predicate` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        time.sleep(interval)


def http_status(url: str, timeout: float = 1.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


@dataclass
class ServerProcess:
    """A server started as a real subprocess, listening on 127.0.0.1:port."""

    args: list[str]
    port: int
    env: dict = field(default_factory=dict)
    log: Path | None = None
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_path: str | None = "/health", timeout: float = 15.0) -> ServerProcess:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )
        if ready_path is not None:
            self.wait_ready(ready_path, timeout)
        return self

    def wait_ready(self, path: str = "/health", timeout: float = 15.0):
        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.args[:4]} exited with {self.proc.returncode}: {self.tail()}")
            return http_status(self.url + path) == 200

        wait_until(ready, timeout, what=f"{self.url}{path} answering 200")

    def tail(self, n: int = 30) -> str:
        if self.log and self.log.exists():
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""

    def stop(self, timeout: float = 10.0):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def sse(response: requests.Response) -> list:
    """The `data:` payloads of a stream: dicts, and the string "[DONE]"."""
    events = []
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "", f"unexpected SSE line {line!r}"
    return events


class Proxy(ServerProcess):
    """dcu-proxy started from a YAML file as `python -m dcu_serving.proxy --config FILE`."""

    config_path: Path
    results_path: Path
    admin_port: int
    backends: list

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def post(self, path: str, payload, timeout: float = 30, headers: dict | None = None, **kw) -> requests.Response:
        data = payload if isinstance(payload, (str, bytes)) else json.dumps(payload)
        return requests.post(self.url + path, data=data, timeout=timeout,
                             headers={"Content-Type": "application/json", **(headers or {})}, **kw)

    def chat(self, payload, **kw) -> requests.Response:
        return self.post("/v1/chat/completions", payload, **kw)

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

    def settled_results(self, orid: str) -> list[dict]:
        """The orid's records once every earlier request's record is written.

        The proxy writes the log off its event loop, in order: a marker request (a cheap 4xx or 503) that
        shows up in the log proves that everything sent before it is there too. Its orid also goes in the X-Orid
        header: a proxy with no healthy backend refuses a body that came after its head unread.
        """
        marker = f"marker-{uuid.uuid4().hex}"
        self.chat({"model": "no-such-model", "messages": [], "user": marker}, timeout=5, headers={"X-Orid": marker})
        wait_until(lambda: any(r["orid"] == marker for r in self.results()), 10,
                   what="the marker line in the results log")
        return [r for r in self.results() if r["orid"] == orid]

    def rewrite_config(self, **settings):
        config = yaml.safe_load(self.config_path.read_text())
        config.update(settings)
        self.config_path.write_text(yaml.safe_dump(config))

    def signal(self, sig: int = signal.SIGHUP):
        self.proc.send_signal(sig)


def local_play(tmp_path: Path, inventory: dict, play: list, host: str = "node") -> tuple[int, str, list]:
    """Run a play with ansible-playbook on this machine, as the collection's playbooks run: (return code, whole
    output, each task's result on `host` in order; Ansible's JSON callback)."""
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "hosts.yml"),
         str(tmp_path / "play.yml")],
        capture_output=True, text=True, cwd=REPO, timeout=120,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    tasks = json.loads(done.stdout)["plays"][0]["tasks"]
    return done.returncode, done.stdout + done.stderr, [t["hosts"][host] for t in tasks if host in t["hosts"]]


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
    proxy.backends = list(backends)
    return proxy


def make_bundle(bundle: Path, files: dict[str, bytes], kind: str | None = None) -> list[dict]:
    """A small format-1 bundle: each {relative file: bytes} as an artifact (of the kind its directory holds,
    unless `kind` says), index.json and SHA256SUMS as dcu-bundle writes them. Returns the artifacts."""
    from dcu_serving.bundle import KINDS
    from dcu_serving.bundle.artifact import Artifact, write_artifacts

    kind_of = {directory: name for name, directory in KINDS.items()}
    artifacts = []
    for rel, data in files.items():
        path = bundle / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        artifacts.append(Artifact(name=Path(rel).name.split("-")[0], kind=kind or kind_of[rel.split("/")[0]],
                                  version="1.0", file=rel,
                                  sha256=hashlib.sha256(data).hexdigest(), size=len(data), source="tests"))
    write_artifacts(bundle, artifacts)
    return [a.to_json() for a in artifacts]
