#!/usr/bin/env python3
"""What the fleet's gateway costs: the same load straight to a host's dcu-proxy and through LiteLLM in front of
it, side by side in one run, against 8 simulators that answer at once.

For each concurrency: requests/s, p50/p99 latency, errors, and the CPU per request of dcu-proxy and of the gateway
(its process and its workers, utime+stime from /proc). With --workers 1,2 the gateway is started once per worker
count. The load comes from one Python process (aiohttp, closed loop, keep-alive): on a shared 2-core machine it
competes with what it measures, so read the figures side by side, not as absolutes.

    .venv/bin/python bench/gateway_overhead.py [--seconds 10] [--concurrency 1,32] [--workers 1] [--json out.json]

Needs build/gateway-venv (`make gateway`) or DCU_LITELLM naming litellm in a venv that also holds dcu-serving.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_harness import MODEL, REQUEST, Harness, cpu_seconds, free_port, http_status, wait_for

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
from dcu_serving.gateway.config import gateway_config  # noqa: E402

LITELLM = os.environ.get("DCU_LITELLM", str(REPO / "build/gateway-venv/bin/litellm"))
FAST_SIM = ("--max-num-seqs", "8", "--sim-ttft-ms", "0", "--sim-itl-ms", "0", "--sim-itl-jitter", "0",
            "--sim-answer-tokens", "8", "--sim-think-tokens", "0")
KEY = "sk-bench-0123456789abcdef"


def tree_cpu(pid: int) -> float:
    """CPU seconds of `pid` and every process below it (LiteLLM's workers)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += cpu_seconds(p)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def start_gateway(h: Harness, proxy_url: str, workers: int):
    port = free_port()
    config = h.tmp / f"gateway-{port}.yaml"
    config.write_text(yaml.safe_dump(gateway_config([{"name": "host", "url": proxy_url, "models": [MODEL]}])))
    keys = h.tmp / "keys.json"
    keys.write_text(json.dumps({"callers": [{"alias": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}))
    env = {**os.environ, "LITELLM_MASTER_KEY": "sk-master-0123456789abcdef", "DCU_GATEWAY_KEYS": str(keys),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    proc = h.spawn([LITELLM, "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                    "--num_workers", str(workers)], f"gateway-{port}.log", env)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_status(url + "/health/liveliness") == 200, 180, f"gateway {url}")
    return url, proc


async def load(url: str, concurrency: int, seconds: float) -> dict:
    """A closed loop of `concurrency` callers for `seconds`; latencies of the answered requests."""
    latencies, errors = [], 0
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    body = json.dumps(REQUEST).encode()
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def caller():
            nonlocal errors
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                try:
                    async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
                        await r.read()
                        ok = r.status == 200
                except aiohttp.ClientError:
                    ok = False
                if ok:
                    latencies.append((time.perf_counter() - t0) * 1000)
                else:
                    errors += 1
        await asyncio.gather(*(caller() for _ in range(concurrency)))
    latencies.sort()
    n = len(latencies)
    return {"requests": n, "errors": errors, "rps": n / seconds,
            "p50": statistics.median(latencies) if n else None,
            "p99": latencies[min(n - 1, int(n * 0.99))] if n else None}


def measure(name, url, pids, concurrency, seconds) -> dict:
    asyncio.run(load(url, concurrency, min(2.0, seconds)))  # warm-up: connections, caches
    before = {k: tree_cpu(p) for k, p in pids.items()}
    result = asyncio.run(load(url, concurrency, seconds))
    for k, p in pids.items():
        result[f"{k}_cpu_ms_per_req"] = (tree_cpu(p) - before[k]) * 1000 / max(result["requests"], 1)
    return {"path": name, "concurrency": concurrency, **result}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--workers", default="1")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not Path(LITELLM).exists():
        sys.exit(f"{LITELLM} is missing: build the gateway's venv with `make gateway`")
    h = Harness()
    rows = []
    try:
        sims = h.start_sims(8, *FAST_SIM)
        proxy_url, proxy = h.start_proxy(sims, backend_concurrency=8,
                                         gateway={"url": "http://127.0.0.1", "allow": ["127.0.0.1"]})
        for workers in [int(w) for w in args.workers.split(",")]:
            gateway_url, gateway = start_gateway(h, proxy_url, workers)
            for c in [int(x) for x in args.concurrency.split(",")]:
                rows.append(measure("dcu-proxy", proxy_url, {"proxy": proxy.pid}, c, args.seconds))
                rows.append({**measure(f"gateway x{workers}", gateway_url,
                                       {"proxy": proxy.pid, "gateway": gateway.pid}, c, args.seconds)})
            h.stop(gateway)
    finally:
        h.close()
    print(f"{'path':<12} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} "
          f"{'proxy CPU ms/req':>17} {'gateway CPU ms/req':>19}")
    for r in rows:
        print(f"{r['path']:<12} {r['concurrency']:>4} {r['rps']:>8.1f} {r['p50'] or 0:>8.1f} {r['p99'] or 0:>8.1f} "
              f"{r['errors']:>6} {r['proxy_cpu_ms_per_req']:>17.2f} {r.get('gateway_cpu_ms_per_req', 0):>19.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
