#!/usr/bin/env python3
"""How near dcu-proxy runs to the floor of its design: four front ends side by side against 8 simulators.

  nginx            as in proxy_overhead.py (least_conn, keepalive upstreams, one worker)
  dcu-proxy        the real thing: contract, least-active routing, results log, metrics
  aiohttp relay    aiohttp's low-level server and dcu-proxy's upstream client, round-robin; nothing else
  httptools relay  an asyncio protocol parsing with httptools, the same upstream client; nothing else

The relays check nothing, log nothing and count nothing: they show what the inbound HTTP server alone
costs, the floor under any proxy built on it. wrk, short non-streamed requests, paths interleaved with the
direct path (wrk straight to the simulators); req/s, p50/p99 latency added over direct and CPU per request
(utime+stime) of each front end, medians over the rounds.

    .venv/bin/python bench/proxy_floor.py [--seconds 5] [--rounds 3] [--connections 32] [--nice -5]

`--connections 1` shows the floor of the added latency when nothing queues (issue 4's p50 <= 0.5 ms).

`--nice` runs every front end at that nice value (root only), as proxy_overhead.py's extra rows do.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_harness import Harness, free_port, http_status, wait_for
from proxy_overhead import FAST_SIM, measure

from dcu_serving.proxy.upstream import Pool

DEADLINE = 30.0


def _pools(backends: list[str]) -> list[Pool]:
    return [Pool(host, int(port), 5) for host, port in (url.rsplit("/", 1)[1].split(":") for url in backends)]


async def _forward(pool: Pool, method: bytes, path: bytes, body: bytes) -> tuple[int, bytes]:
    head = pool.build_head(method, path, b"Content-Type: application/json\r\n", len(body))
    conn = await pool.request(head, body, pool.loop.time() + DEADLINE)
    try:
        return conn.status, conn.body() if conn.complete else await conn.read()
    finally:
        conn.release()


async def aiohttp_relay(port: int, backends: list[str]):
    from aiohttp import web

    pools = itertools.cycle(_pools(backends))

    async def relay(request: web.BaseRequest) -> web.Response:
        pool = next(pools)
        status, body = await _forward(pool, request.method.encode(), request.raw_path.encode(), await request.read())
        return web.Response(body=body, status=status, headers={"Content-Type": "application/json",
                                                                 "X-Backend": pool.name})

    runner = web.ServerRunner(web.Server(relay, access_log=None))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=2048).start()
    await asyncio.Event().wait()


async def httptools_relay(port: int, backends: list[str]):
    import httptools

    pools = itertools.cycle(_pools(backends))

    class Inbound(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.path = b""
            self.chunks: list[bytes] = []
            self.task = None  # one request at a time: wrk does not pipeline

        def data_received(self, data):
            self.parser.feed_data(data)

        def on_url(self, url):
            self.path = url

        def on_body(self, body):
            self.chunks.append(body)

        def on_message_complete(self):
            body, self.chunks = b"".join(self.chunks), []
            self.task = asyncio.ensure_future(self.relay(self.parser.get_method(), self.path, body))

        async def relay(self, method: bytes, path: bytes, body: bytes):
            pool = next(pools)
            status, answer = await _forward(pool, method, path, body)
            self.transport.write(b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nX-Backend: %s\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (status, pool.name.encode(), len(answer), answer))

    await asyncio.get_running_loop().create_server(Inbound, "127.0.0.1", port, backlog=2048)
    await asyncio.Event().wait()


RELAYS = {"aiohttp": aiohttp_relay, "httptools": httptools_relay}


def start_relay(h: Harness, kind: str, backends: list[str]) -> tuple[str, subprocess.Popen]:
    port = free_port()
    proc = h.spawn([sys.executable, __file__, "--relay", kind, "--port", str(port), *backends],
                    f"relay-{kind}-{port}.log")
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_status(url + "/health") == 200, 30, f"{kind} relay {url}/health")
    return url, proc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5, help="length of each measured wrk run")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians are reported)")
    ap.add_argument("--connections", type=int, default=32, help="wrk connections (concurrent requests)")
    ap.add_argument("--nice", type=int, default=0, help="nice value for every front end (root only)")
    ap.add_argument("--relay", choices=RELAYS, help=argparse.SUPPRESS)  # internal: run one relay
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("backends", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.relay:
        from uvloop import run
        run(RELAYS[args.relay](args.port, args.backends))
        return

    h = Harness()
    try:
        sims = h.start_sims(8, *FAST_SIM)
        fronts = {"nginx": h.start_nginx(sims, "least_conn"), "dcu-proxy": h.start_proxy(sims),
                  "aiohttp relay": start_relay(h, "aiohttp", sims),
                  "httptools relay": start_relay(h, "httptools", sims)}
        for _, proc in fronts.values():
            os.setpriority(os.PRIO_PROCESS, proc.pid, args.nice)
        runs: dict[str, list[dict]] = {name: [] for name in ("direct", *fronts)}
        order = list(fronts.items())
        c = args.connections
        for round_ in range(args.rounds):  # interleaved, alternating order: drift hits every path alike
            runs["direct"].append(measure(h, "direct", sims[0], None, [], c, args.seconds,
                                          spread=sims if c > 1 else None))
            for name, (url, proc) in order if round_ % 2 == 0 else order[::-1]:
                result = measure(h, name, url, proc.pid, [], c, args.seconds)
                if result["errors"]:
                    raise SystemExit(f"{name}: {result['errors']} errors")
                runs[name].append(result)
    finally:
        h.close()

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    print(f"\n== front ends at concurrency {c}, nice {args.nice:+d} (8 simulators; medians of {args.rounds}) ==")
    print(f"  {'path':<16} {'req/s':>8} {'x nginx':>8} {'+p50 ms':>8} {'+p99 ms':>8} {'CPU ms/req':>11}")
    for name in runs:
        rps = median(name, "rps")
        added = "".join(f" {median(name, p) - median('direct', p):>+8.3f}" for p in ("p50", "p99"))
        cpu = f"{median(name, 'cpu_ms_per_req'):>11.3f}" if name != "direct" else f"{'-':>11}"
        print(f"  {name:<16} {rps:>8.0f} {rps / median('nginx', 'rps'):>8.2f}{added} {cpu}")


if __name__ == "__main__":
    main()
