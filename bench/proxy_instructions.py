#!/usr/bin/env python3
"""Instructions dcu-proxy executes per request, counted by valgrind's callgrind: the same count every run.

CPU time on a shared two-core machine moves by ±20% from one minute to the next, more than most single
changes save; the instruction count moves by a fraction of a percent. Use it to decide whether a change
to the request path pays, then confirm in CPU time with proxy_overhead.py. It counts user-space
instructions only (the kernel's share of each system call is not in it).

    .venv/bin/python bench/proxy_instructions.py [--src DIR ...] [--seconds 6]

Each --src is a directory holding a `dcu_serving` package (e.g. from `git archive`), measured in turn;
without one, the installed package is. Needs valgrind (`apt-get install valgrind`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_harness import REQUEST, Harness, wrk
from proxy_overhead import FAST_SIM


def instructions_per_request(h: Harness, sims: list[str], src: str | None, seconds: float) -> tuple[float, int]:
    out = h.tmp / f"callgrind-{len(list(h.tmp.glob('callgrind-*')))}"
    env = {**os.environ, "PYTHONPATH": src} if src else None
    url, proxy = h.start_proxy(sims, env=env, ready_within=120, wrapper=(
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p"))
    wrk(url, 8, 3, REQUEST, tmp=h.tmp)  # warm-up: imports done, connections open, caches filled
    subprocess.run(["callgrind_control", "--instr=on", str(proxy.pid)], check=True, capture_output=True)
    requests = wrk(url, 8, seconds, REQUEST, tmp=h.tmp)["requests"]
    subprocess.run(["callgrind_control", "--instr=off", str(proxy.pid)], check=True, capture_output=True)
    proxy.send_signal(signal.SIGTERM)  # callgrind writes its counts as the process exits
    proxy.wait(120)
    counted = sum(int(m.group(1)) for path in h.tmp.glob(f"{out.name}.*")
                  for m in re.finditer(r"^totals: (\d+)", path.read_text(), re.M))
    return counted / requests, requests


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", action="append", help="a directory holding a dcu_serving package (repeatable)")
    ap.add_argument("--seconds", type=float, default=6, help="length of the counted wrk run")
    args = ap.parse_args()
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    h = Harness()
    try:
        sims = h.start_sims(8, *FAST_SIM)
        for src in args.src or [None]:
            per_request, requests = instructions_per_request(h, sims, src, args.seconds)
            print(f"{src or 'installed dcu_serving'}: {per_request / 1000:.1f}k instructions per request "
                  f"({requests} requests counted)")
    finally:
        h.close()


if __name__ == "__main__":
    main()
