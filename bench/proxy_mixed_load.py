#!/usr/bin/env python3
"""Mixed short and long requests at ~90% of the 32 slots: where do requests wait, and what does it cost?

The same seeded open-loop (Poisson) workload is sent through three front ends, one after the other, to the
same 8 simulators (`--max-num-seqs 4` each, so 32 slots like the real cluster):

  dcu-proxy          least-active with a per-card cap of 4; excess requests wait in the proxy's FIFO
  nginx least_conn   fewest open connections; excess requests queue inside one card
  nginx round-robin  nginx's default

A request queued inside a card cannot move when another card frees up; one queued in the proxy can, so
short requests should not get stuck behind long ones: compare the p99 of the short requests.

    .venv/bin/python bench/proxy_mixed_load.py [--seconds 15] [--rounds 2] [--load 0.9] [--json out.json]

Figures from a shared 2-core machine are noisy: re-measure on a quiet one before quoting them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_harness import REQUEST, Harness

SLOTS = 32
TTFT_MS, ITL_MS = 30, 5
SHORT_TOKENS, LONG_TOKENS, LONG_SHARE = 20, 400, 0.2
SIM = ("--max-num-seqs", "4", "--sim-ttft-ms", str(TTFT_MS), "--sim-itl-ms", str(ITL_MS),
       "--sim-itl-jitter", "0", "--sim-think-tokens", "0", "--sim-answer-tokens", str(LONG_TOKENS * 2))


def workload(seconds: float, load: float, seed: int) -> list[tuple[float, int]]:
    """(send time, max_tokens) pairs: Poisson arrivals that keep `load` of the slots busy on average."""
    service = {t: (TTFT_MS + t * ITL_MS) / 1000 for t in (SHORT_TOKENS, LONG_TOKENS)}
    mean = (1 - LONG_SHARE) * service[SHORT_TOKENS] + LONG_SHARE * service[LONG_TOKENS]
    rate = load * SLOTS / mean
    rng = random.Random(seed)
    at, out = 0.0, []
    while at < seconds:
        at += rng.expovariate(rate)
        out.append((at, LONG_TOKENS if rng.random() < LONG_SHARE else SHORT_TOKENS))
    return out


async def run(url: str, plan: list[tuple[float, int]]) -> list[tuple[int, float, int]]:
    """(max_tokens, latency s, status) per request, sent open-loop at the planned times."""
    results = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def one(max_tokens: int):
            started = time.perf_counter()
            try:
                async with session.post(url + "/v1/chat/completions",
                                        json={**REQUEST, "max_tokens": max_tokens}) as r:
                    await r.read()
                    status = r.status
            except aiohttp.ClientError:
                status = 0
            results.append((max_tokens, time.perf_counter() - started, status))

        t0 = time.perf_counter()
        tasks = []
        for at, max_tokens in plan:
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(max_tokens)))
        await asyncio.gather(*tasks)
    return results


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))] if values else float("nan")


def summarise(results) -> dict:
    out = {"requests": len(results), "errors": sum(1 for r in results if r[2] != 200)}
    for label, tokens in (("short", SHORT_TOKENS), ("long", LONG_TOKENS), ("all", None)):
        lat = [r[1] * 1000 for r in results if tokens is None or r[0] == tokens]
        out[label] = {"p50": pct(lat, 50), "p99": pct(lat, 99), "n": len(lat)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15, help="length of the workload per round and front end")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (results are pooled)")
    ap.add_argument("--load", type=float, default=0.9, help="share of the 32 slots kept busy on average")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    plan = workload(args.seconds, args.load, args.seed)
    h = Harness()
    try:
        sims = h.start_sims(8, *SIM)
        fronts = [("dcu-proxy", *h.start_proxy(sims)),
                  ("nginx least_conn", *h.start_nginx(sims, "least_conn")),
                  ("nginx round-robin", *h.start_nginx(sims, "round_robin"))]
        for _, url, _ in fronts:
            asyncio.run(run(url, workload(2, args.load, args.seed + 1)))  # warm-up
        collected = {name: [] for name, _, _ in fronts}
        for _ in range(args.rounds):  # interleaved: drift on a shared machine hits every front end alike
            for name, url, _ in fronts:
                collected[name] += asyncio.run(run(url, plan))
        res = {name: summarise(results) for name, results in collected.items()}
    finally:
        h.close()
    short_ms = TTFT_MS + SHORT_TOKENS * ITL_MS
    long_ms = TTFT_MS + LONG_TOKENS * ITL_MS
    print(f"\n== mixed load: {args.rounds} x {len(plan)} requests in {args.seconds:g} s at {args.load:.0%} of "
          f"{SLOTS} slots; {1 - LONG_SHARE:.0%} short (~{short_ms} ms), {LONG_SHARE:.0%} long (~{long_ms} ms) ==")
    print(f"  {'front end':<18} {'short p50':>9} {'short p99':>9} {'long p50':>9} {'long p99':>9} "
          f"{'all p99':>9} {'errors':>6}   (ms)")
    for name, r in res.items():
        print(f"  {name:<18} {r['short']['p50']:>9.0f} {r['short']['p99']:>9.0f} {r['long']['p50']:>9.0f} "
              f"{r['long']['p99']:>9.0f} {r['all']['p99']:>9.0f} {r['errors']:>6}")
    proxy = res["dcu-proxy"]["short"]["p99"]
    for other in ("nginx least_conn", "nginx round-robin"):
        print(f"short-request p99: {other} / dcu-proxy = {res[other]['short']['p99'] / proxy:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
