"""What the client tests share: simulator timing and a handle on a running service."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from support import ServerProcess, wait_until

# Fast, deterministic simulator timing: a few thinking tokens, a short answer.
FAST = ("--sim-ttft-ms", "5", "--sim-itl-ms", "2", "--sim-itl-jitter", "0",
        "--sim-think-tokens", "12", "--sim-answer-tokens", "10")


@dataclass
class Service:
    proxy: ServerProcess
    backends: list
    results_log: Path

    @property
    def url(self) -> str:
        return self.proxy.url

    def results(self, orid: str | None = None) -> list[dict]:
        """Lines of the proxy's results log so far, optionally only those of one orid."""
        if not self.results_log.exists():
            return []
        lines = [json.loads(line) for line in self.results_log.read_text().splitlines() if line.strip()]
        return [r for r in lines if orid is None or r.get("orid") == orid]

    def settled_results(self, orid: str) -> list[dict]:
        """The orid's lines once every earlier request's line is written.

        The proxy writes the log off its event loop, in order: a marker request (a cheap 400) that
        shows up in the log proves that everything sent before it is there too.
        """
        marker = f"marker-{uuid.uuid4().hex}"
        request = urllib.request.Request(
            self.url + "/v1/chat/completions", method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"model": "no-such-model", "messages": [], "user": marker}).encode())
        with contextlib.suppress(urllib.error.HTTPError):  # the 400 is the point
            urllib.request.urlopen(request, timeout=5).close()
        wait_until(lambda: self.results(marker), 10, what="the marker line in the results log")
        return self.results(orid)
