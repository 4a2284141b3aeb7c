"""Helpers shared by the tests: free ports, real subprocesses, polling with a deadline."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERVED_MODEL = "MiniCPM-V-4.5"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
