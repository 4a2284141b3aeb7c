#!/usr/bin/env python3
"""dcu-proxy in its container vs in a venv: the two dcu_proxy runtimes side by side in one run.

  direct      wrk straight to the simulators (concurrency 1: one; 32: thread i -> simulator i)
  venv        a venv built as the role builds it: the host's python3 (--venv-python, Debian's 3.11 here, the
              image's Python too) with dcu-serving[proxy] from the bundle's wheelhouse (--wheelhouse), offline
  container   the bundle's image (tools/build-proxy-image), run as the dcu_proxy unit runs it: --network host,
              an unprivileged user, read-only root, --cap-drop ALL, no-new-privileges, Docker's default seccomp
              profile, the config directory read-only and the log directory read-write. Its process is moved
              into this benchmark's CPU cgroup, so that both proxies compete for the CPU alike
  container*  the same container in the CPU cgroup Docker gave it: on a machine shared with other containers
              it competes as part of Docker's group, not as a process beside the simulators (shown, not judged)

The same configuration (results log on, as in production), the same 8 simulators, rounds interleaved so
drift on a shared machine hits every path alike. Per path: req/s, p50/p99 and the proxy process's CPU time
per request (utime+stime from /proc: the container's process is a process of this host). Also the time from
start to a healthy /health, and the RSS after the load. Needs root (cgroup moves) and Docker.

    .venv/bin/python bench/proxy_runtime.py [--seconds 10] [--rounds 3] [--image dcu-serving/proxy:0.1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_harness import MODEL, Harness, free_port, http_status, rss_mb, wait_for
from proxy_overhead import FAST_SIM, measure


def _config(h: Harness, directory: Path, backends: list[str]) -> tuple[str, Path]:
    port = free_port()
    directory.mkdir()
    directory.chmod(0o755)
    logs = directory / "log"
    logs.mkdir()
    logs.chmod(0o777)  # the container's user writes the results log here
    path = directory / "proxy.yml"
    path.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{port}", "backends": backends, "models": [MODEL],
                                    "results_log": str(logs / "results.jsonl"), "admin": {"listen": None}}))
    path.chmod(0o644)
    return f"http://127.0.0.1:{port}", path


def build_venv(h: Harness, python: str, wheelhouse: str) -> str:
    """dcu-serving[proxy] offline from the wheelhouse, into a venv of `python` (what the role does)."""
    venv = h.tmp / "proxy-venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/pip"), "install", "--quiet", "--no-index", "--disable-pip-version-check",
                    "--find-links", wheelhouse, "dcu-serving[proxy]"], check=True,
                   env=dict(os.environ, PIP_CONFIG_FILE=os.devnull))
    return str(venv / "bin/python")


def start_venv(h: Harness, backends: list[str], python: str):
    url, path = _config(h, h.tmp / "venv", backends)
    started = time.monotonic()
    # A session of its own, like the container's process (started by Docker): with the kernel's autogroup
    # scheduling on, each session is one scheduling entity; in the benchmark's session the proxy would
    # share one with the simulators and wrk.
    log = open(h.tmp / "proxy-venv.log", "ab")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen([python, "-m", "dcu_serving.proxy", "--config", str(path)], stdout=log,
                            stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=""), start_new_session=True)
    h.procs.append(proc)
    wait_for(lambda: http_status(url + "/health") == 200, 60, "venv proxy /health")
    return url, proc, proc.pid, time.monotonic() - started


def start_container(h: Harness, backends: list[str], image: str, name: str):
    url, path = _config(h, h.tmp / "container", backends)
    subprocess.run(["docker", "rm", "--force", name], capture_output=True)
    started = time.monotonic()
    proc = h.spawn(["docker", "run", "--rm", f"--name={name}", "--pull=never", "--log-driver=none", "--network=host",
                    "--user=65534:65534", "--read-only", "--tmpfs=/tmp:rw,noexec,nosuid,size=16m", "--cap-drop=ALL",
                    "--security-opt=no-new-privileges", f"--volume={path.parent}:{path.parent}:ro",
                    f"--volume={path.parent / 'log'}:{path.parent / 'log'}:rw",
                    image, "dcu-proxy", "--config", str(path)], "proxy-container.log")
    wait_for(lambda: http_status(url + "/health") == 200, 120, "container proxy /health")
    pid = int(subprocess.run(["docker", "inspect", "--format", "{{.State.Pid}}", name], capture_output=True,
                             text=True, check=True).stdout)
    return url, proc, pid, time.monotonic() - started


def _cpu_cgroup(pid: int | str) -> Path:
    """The directory of the cgroup v1 `cpu` controller that `pid` is in."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return Path("/sys/fs/cgroup/cpu") / path.lstrip("/")
    raise RuntimeError("no cgroup v1 cpu controller: run where /sys/fs/cgroup/cpu is mounted")


def move(pid: int, cgroup: Path):
    (cgroup / "cgroup.procs").write_text(str(pid))


def _median(results: list[dict]) -> dict:
    merged = dict(results[0])
    for key, value in results[0].items():
        if isinstance(value, (int, float)):
            merged[key] = type(value)(statistics.median(r[key] for r in results))
    merged["spread_cpu"] = [round(r.get("cpu_ms_per_req", 0), 4) for r in results]
    return merged


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10, help="length of each measured wrk run")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per path (median is reported)")
    ap.add_argument("--image", default="dcu-serving/proxy:0.1.0", help="the proxy image (tools/build-proxy-image)")
    ap.add_argument("--venv-python", default="/usr/bin/python3", help="the interpreter of the venv path")
    ap.add_argument("--wheelhouse", default=str(Path(__file__).resolve().parents[1] / "build/bundle/wheels"),
                    help="wheels for the venv (make bundle), installed offline")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    name = f"dcu-proxy-bench-{os.getpid()}"
    h = Harness()
    try:
        sims = h.start_sims(8, *FAST_SIM)
        python = build_venv(h, args.venv_python, args.wheelhouse)
        venv_url, _, venv_pid, venv_start = start_venv(h, sims, python)
        box_url, _, box_pid, box_start = start_container(h, sims, args.image, name)
        ours, dockers = _cpu_cgroup("self"), _cpu_cgroup(box_pid)
        paths = {"direct": (sims[0], None, None), "venv": (venv_url, venv_pid, None),
                 "container": (box_url, box_pid, ours), "container*": (box_url, box_pid, dockers)}
        res = {"start_seconds": {"venv": venv_start, "container": box_start}, "runs": {},
               "cgroups": {"benchmark": str(ours), "docker": str(dockers)}}
        for connections in (1, 32):
            runs: dict[str, list[dict]] = {path: [] for path in paths}
            for _ in range(args.rounds):
                for path, (url, pid, cgroup) in paths.items():
                    if cgroup:
                        move(pid, cgroup)
                    direct = path == "direct"
                    runs[path].append(measure(h, path, url, pid, h.sim_pids, connections, args.seconds,
                                              spread=sims if direct and connections > 1 else None))
            res["runs"][connections] = {path: _median(results) for path, results in runs.items()}
        res["rss_mb"] = {"venv": rss_mb(venv_pid), "container": rss_mb(box_pid)}
        res["python"] = {"venv": subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                                                capture_output=True, text=True).stdout.strip(),
                         "container": subprocess.run(
            ["docker", "exec", name, "python3", "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True, text=True).stdout.strip()}
    finally:
        subprocess.run(["docker", "stop", "--time=10", name], capture_output=True)
        h.close()
    report(res, args)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str))


def report(res: dict, args):
    print(f"\n== dcu-proxy: venv vs container (8 simulators, short non-streamed requests, {args.rounds} interleaved "
          f"rounds of {args.seconds:g} s, medians) ==")
    print(f"Python: venv {res['python']['venv']}, container {res['python']['container']}")
    for c, paths in res["runs"].items():
        print(f"\nconcurrency {c}:")
        print(f"  {'path':<11} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'CPU ms/req':>11}  rounds")
        for path, r in paths.items():
            cpu = f"{r['cpu_ms_per_req']:.3f}" if "cpu_ms_per_req" in r else "-"
            spread = " ".join(f"{x:.3f}" for x in r["spread_cpu"]) if "cpu_ms_per_req" in r else ""
            print(f"  {path:<11} {r['rps']:>8.0f} {r['p50']:>8.3f} {r['p99']:>8.3f} {r['errors']:>7} {cpu:>11}  "
                  f"{spread}")
        d, v, b = paths["direct"], paths["venv"], paths["container"]
        print(f"  added p50 over direct: venv +{v['p50'] - d['p50']:.3f} ms, container +{b['p50'] - d['p50']:.3f} ms; "
              f"container - venv: p50 {b['p50'] - v['p50']:+.3f} ms, p99 {b['p99'] - v['p99']:+.3f} ms, "
              f"CPU {b['cpu_ms_per_req'] - v['cpu_ms_per_req']:+.3f} ms/req "
              f"({b['cpu_ms_per_req'] / v['cpu_ms_per_req']:.2f}x)")
    print("  (container*: in the CPU cgroup Docker gave it, not the benchmark's: shown, not compared)")
    s = res["start_seconds"]
    print(f"\nstart to a healthy /health: venv {s['venv']:.2f} s, container {s['container']:.2f} s (docker run)")
    print(f"RSS after the load: venv {res['rss_mb']['venv']:.1f} MB, container {res['rss_mb']['container']:.1f} MB")


if __name__ == "__main__":
    main()
