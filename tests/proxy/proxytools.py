"""Helpers for the dcu-proxy tests: simulator timings, request bodies, many simulators at once.

The proxy process itself (Proxy, make_proxy, the start_proxy fixture) and sse() are shared by every suite:
tests/support.py and tests/conftest.py."""

from __future__ import annotations

from support import SERVED_MODEL, ServerProcess


def slow(itl_ms: float = 50, tokens: int = 40) -> tuple:
    """Simulator arguments for requests that take about itl_ms * tokens."""
    return ("--sim-ttft-ms", "5", "--sim-itl-ms", str(itl_ms), "--sim-itl-jitter", "0",
            "--sim-think-tokens", "0", "--sim-answer-tokens", str(tokens), "--max-num-seqs", "4")


# Simulator timing for most tests: no thinking, 10 answer tokens 2 ms apart.
FAST = slow(itl_ms=2, tokens=10)


def body(text: str = "Read the invoice number.", **extra) -> dict:
    return {"model": SERVED_MODEL, "user": "10001", "messages": [{"role": "user", "content": text}],
            "chat_template_kwargs": {"enable_thinking": False}, **extra}


def start_sims(start_sim, count: int, *args: str) -> list[ServerProcess]:
    """Start `count` simulators in parallel and wait for all of them."""
    sims = [start_sim(*args, wait=False) for _ in range(count)]
    for sim in sims:
        sim.wait_ready()
    return sims
