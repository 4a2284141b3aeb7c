#!/usr/bin/env python3
"""A flood of large bodies while every card is busy: how much memory does dcu-proxy take, does it still answer,
and what does bounding it cost? Two proxies side by side in one run, against the same 8 simulators:

  this tree   body_budget (the default, 128 MiB): a large body past it is refused before it is read
  baseline    --baseline DIR, a directory holding another dcu_serving package (main's, from `git archive`)

For each proxy in turn: 32 long requests take every card's slots; then `--callers` (48) send a
`--body-mib` (24 MiB) chat request each, at once; the proxy's RSS is sampled every 20 ms from before the flood
until every caller has its answer. Then a normal request, right after. Then `--half` (100) connections to
each proxy at once that send half a request's headers and stop: how many each proxy still holds after 65 s
(idle_timeout is 60 s). Last, the throughput cost of the bound: wrk at 32 connections, short requests, both
proxies interleaved (CPU per request and req/s).

    .venv/bin/python bench/proxy_body_flood.py --baseline /tmp/main/src [--callers 48] [--body-mib 24]

Issue 30's figure: RSS grows by less than 512 MiB during the flood, and the normal request right after is
answered. Figures from a shared 2-core machine are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_harness import REQUEST, Harness, rss_mb
from proxy_overhead import FAST_SIM, measure

BUSY_TOKENS, ITL_MS = 1500, 5  # each busy request holds its slot ~7.5 s
SIM = ("--max-num-seqs", "4", "--sim-ttft-ms", "0", "--sim-itl-ms", str(ITL_MS), "--sim-itl-jitter", "0",
       "--sim-think-tokens", "0", "--sim-answer-tokens", str(BUSY_TOKENS * 2), "--max-model-len", "100000000",
       "--sim-prefill-tokens-per-s", "1000000000")


def big_body(mib: int) -> bytes:
    """A chat request of `mib` MiB: a long text, as a batch of images inlined would make it."""
    raw = json.dumps({**REQUEST, "max_tokens": 1, "messages": [{"role": "user", "content": "PAD"}]}).encode()
    return raw.replace(b"PAD", b"x" * ((mib << 20) - len(raw) + 3), 1)


class RssSampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0.0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(0.02)


async def flood(url: str, callers: int, body: bytes) -> dict:
    """Busy every card, send the flood, wait for every answer, then one normal request."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def post(data: bytes) -> int:
            try:
                async with session.post(url + "/v1/chat/completions", data=data,
                                        headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    return r.status
            except aiohttp.ClientError:
                return 0

        busy = [asyncio.ensure_future(post(json.dumps({**REQUEST, "max_tokens": BUSY_TOKENS}).encode()))
                for _ in range(32)]
        while True:  # every slot taken
            async with session.get(url + "/__lb_status") as r:
                if sum(b["active"] for b in (await r.json())["backends"]) >= 32:
                    break
            await asyncio.sleep(0.05)
        started = time.perf_counter()
        statuses = await asyncio.gather(*(post(body) for _ in range(callers)))
        answered_s = time.perf_counter() - started
        t = time.perf_counter()
        normal = await post(json.dumps(REQUEST).encode())
        normal_ms = (time.perf_counter() - t) * 1000
        await asyncio.gather(*busy)
    return {"statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))}, "answered_s": answered_s,
            "normal_status": normal, "normal_ms": normal_ms}


def half_headers(urls: list[str], count: int, wait: float) -> list[dict]:
    """`count` connections per proxy that send half a request's headers; after `wait` s, how many are open and
    when the closed ones closed."""
    conns = []
    for url in urls:
        port = int(url.rsplit(":", 1)[1])
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: applic")
            s.setblocking(False)
            conns.append((url, s))
    started = time.monotonic()
    closed: dict[int, float] = {}
    while time.monotonic() - started < wait:
        for i, (_, s) in enumerate(conns):
            if i in closed:
                continue
            try:
                if s.recv(4096) == b"":
                    closed[i] = time.monotonic() - started
            except BlockingIOError:
                pass
            except OSError:
                closed[i] = time.monotonic() - started
        time.sleep(0.2)
    out = []
    for url in urls:
        times = [closed[i] for i, (u, _) in enumerate(conns) if u == url and i in closed]
        out.append({"open": count - len(times), "closed_after_s": max(times) if times else None})
    for _, s in conns:
        s.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="a directory holding the dcu_serving package to compare with")
    ap.add_argument("--callers", type=int, default=48)
    ap.add_argument("--body-mib", type=int, default=24)
    ap.add_argument("--half", type=int, default=100, help="half-header connections per proxy")
    ap.add_argument("--seconds", type=float, default=10, help="length of each wrk run")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved wrk rounds (median)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    body = big_body(args.body_mib)
    h = Harness()
    res = {}
    try:
        sims = h.start_sims(8, *SIM)
        env = {**os.environ, "PYTHONPATH": args.baseline}
        for name, extra in (("this tree", {}), ("baseline", {"env": env})):
            url, proc = h.start_proxy(sims, **extra)
            idle = rss_mb(proc.pid)
            sampler = RssSampler(proc.pid)
            sampler.start()
            out = asyncio.run(flood(url, args.callers, body))
            sampler.stop.set()
            sampler.join()
            res[name] = {**out, "idle_mb": idle, "peak_mb": sampler.peak, "growth_mb": sampler.peak - idle}
            h.stop(proc)
        # The bound's cost on ordinary traffic: fast simulators, short requests, both proxies interleaved.
        for proc in list(h.procs):
            h.stop(proc)
        h.sim_pids.clear()
        sims = h.start_sims(8, *FAST_SIM)
        mine, base = h.start_proxy(sims), h.start_proxy(sims, env=env)
        held = half_headers([mine[0], base[0]], args.half, 65)
        res["this tree"]["half"], res["baseline"]["half"] = held
        runs = {"this tree": [], "baseline": []}
        for _ in range(args.rounds):
            for name, (url, proc) in (("this tree", mine), ("baseline", base)):
                runs[name].append(measure(h, name, url, proc.pid, h.sim_pids, 32, args.seconds))
        for name, results in runs.items():
            res[name]["rps"] = sorted(r["rps"] for r in results)[len(results) // 2]
            res[name]["cpu_ms_per_req"] = sorted(r["cpu_ms_per_req"] for r in results)[len(results) // 2]
            res[name]["wrk_errors"] = sum(r["errors"] for r in results)
    finally:
        h.close()
    print(f"\n== {args.callers} callers x {args.body_mib} MiB bodies at once, every card busy (32 slots) ==")
    print(f"  {'proxy':<10} {'idle MB':>8} {'peak MB':>8} {'growth':>8} {'answered in':>12}  flood's statuses"
          f"   normal request right after")
    for name, r in res.items():
        print(f"  {name:<10} {r['idle_mb']:>8.0f} {r['peak_mb']:>8.0f} {r['growth_mb']:>8.0f} "
              f"{r['answered_s']:>11.1f}s  {r['statuses']}   {r['normal_status']} in {r['normal_ms']:.0f} ms")
    print(f"\n== {args.half} connections each that sent half a request's headers, 65 s later ==")
    for name, r in res.items():
        after = r["half"]["closed_after_s"]
        print(f"  {name:<10} {r['half']['open']:>4} still open"
              + (f"; the others closed after {after:.1f} s at the latest" if after is not None else ""))
    print("\n== the bound's cost: wrk, 32 connections, short requests (median of the rounds) ==")
    for name, r in res.items():
        print(f"  {name:<10} {r['rps']:>8.0f} req/s  CPU {r['cpu_ms_per_req']:.3f} ms/request  errors "
              f"{r['wrk_errors']}")
    mine, base = res["this tree"], res["baseline"]
    print(f"this tree / baseline: throughput {mine['rps'] / base['rps']:.3f}x, CPU per request "
          f"{mine['cpu_ms_per_req'] / base['cpu_ms_per_req']:.3f}x")
    met = mine["growth_mb"] < 512 and mine["normal_status"] == 200
    print(f"issue 30's figure: [{'met' if met else 'NOT met'}] growth {mine['growth_mb']:.0f} MB < 512 MiB "
          f"(baseline {base['growth_mb']:.0f} MB), normal request right after: {mine['normal_status']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": res}, indent=2))


if __name__ == "__main__":
    main()
