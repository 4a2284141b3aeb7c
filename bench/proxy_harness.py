"""Processes for the proxy benchmarks: simulators, dcu-proxy, nginx, wrk — all on free local ports.

Every process is started here and stopped by `Harness.close()` (by its own pid, nothing else).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

MODEL = "MiniCPM-V-4.5"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
REQUEST = {"model": MODEL, "user": "10001", "max_tokens": 16,
           "messages": [{"role": "user", "content": "Read the invoice number."}],
           "chat_template_kwargs": {"enable_thinking": False}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not reached within {timeout}s")
        time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Harness:
    def __init__(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="dcu-proxy-bench-"))
        self.procs: list[subprocess.Popen] = []
        self.sim_pids: list[int] = []  # of every simulator started, for their CPU time
        model_dir = self.tmp / "models" / MODEL
        model_dir.mkdir(parents=True)
        (model_dir / "config.json").write_text('{"architectures": ["MiniCPMV"]}')
        (model_dir / "tokenizer_config.json").write_text("{}")  # without it the simulator wants HF_HUB_OFFLINE=1
        self.model_dir = model_dir

    def spawn(self, args, log_name: str, env: dict | None = None) -> subprocess.Popen:
        log = open(self.tmp / log_name, "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append(proc)
        return proc

    def start_sims(self, count: int, *sim_args: str) -> list[str]:
        urls = []
        for _ in range(count):
            port = free_port()
            proc = self.spawn([sys.executable, "-m", "dcu_serving.sim", "serve", str(self.model_dir), "--host",
                               "127.0.0.1", "--port", str(port), "--served-model-name", MODEL, *sim_args],
                              f"sim-{port}.log")
            self.sim_pids.append(proc.pid)
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            wait_for(lambda u=url: http_status(u + "/health") == 200, 60, f"{url}/health")
        return urls

    def start_proxy(self, backends: list[str], *, wrapper: tuple = (), env: dict | None = None,
                    ready_within: float = 30, **settings) -> tuple[str, subprocess.Popen]:
        """dcu-proxy in front of `backends`; `wrapper` runs it under another program (valgrind)."""
        port = free_port()
        config = {"listen": f"127.0.0.1:{port}", "backends": backends, "models": [MODEL],
                  "results_log": str(self.tmp / f"results-{port}.jsonl"), "admin": {"listen": None},
                  **settings}
        path = self.tmp / f"proxy-{port}.yml"
        path.write_text(yaml.safe_dump(config))
        proc = self.spawn([*wrapper, sys.executable, "-m", "dcu_serving.proxy", "--config", str(path)],
                           f"proxy-{port}.log", env)
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_status(url + "/health") == 200, ready_within, f"dcu-proxy {url}/health")
        return url, proc

    def start_nginx(self, backends: list[str], policy: str = "least_conn") -> tuple[str, subprocess.Popen]:
        """nginx as people deploy it in front of vLLM: keepalive upstreams, proxy_buffering off.

        One worker and no master, so its CPU is one process's (dcu-proxy is one process too).
        """
        port = free_port()
        root = self.tmp / f"nginx-{port}"
        root.mkdir()
        balance = "" if policy == "round_robin" else f"{policy};"
        servers = "\n".join(f"    server {u.split('//', 1)[1]} max_fails=1 fail_timeout=10s;" for u in backends)
        (root / "nginx.conf").write_text(f"""
daemon off;
master_process off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {root}/body;
  proxy_temp_path {root}/proxy;
  fastcgi_temp_path {root}/fastcgi;
  uwsgi_temp_path {root}/uwsgi;
  scgi_temp_path {root}/scgi;
  upstream vllm {{
    {balance}
{servers}
    keepalive 64;
  }}
  server {{
    listen 127.0.0.1:{port} backlog=2048;
    client_max_body_size 64m;
    location / {{
      proxy_pass http://vllm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 300s;
    }}
  }}
}}
""")
        proc = self.spawn([NGINX, "-p", str(root), "-c", str(root / "nginx.conf")], f"nginx-{port}.log")
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_status(url + "/health") == 200, 15, f"nginx {url}/health")
        return url, proc

    def stop(self, proc: subprocess.Popen):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self):
        for proc in reversed(self.procs):
            self.stop(proc)
        shutil.rmtree(self.tmp, ignore_errors=True)


# -- wrk --

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(number) * _UNITS[unit]


def wrk(url: str, connections: int, seconds: float, body: dict, threads: int = 1,
        spread_over: list[str] | None = None, tmp: Path | None = None) -> dict:
    """Run wrk POSTing `body`; `spread_over` pins thread i to backend i (the direct path at scale)."""
    script = tmp / f"wrk-{os.getpid()}-{time.monotonic_ns()}.lua"
    lines = ['wrk.method = "POST"', f"wrk.body = {json.dumps(json.dumps(body))}",
             'wrk.headers["Content-Type"] = "application/json"']
    if spread_over:
        ports = ", ".join(f'"{u.rsplit(":", 1)[1]}"' for u in spread_over)
        lines += ["local ports = {" + ports + "}", "local n = 0",
                  "function setup(thread)", "  n = n + 1",
                  '  thread.addr = wrk.lookup("127.0.0.1", ports[((n - 1) % #ports) + 1])[1]', "end"]
    script.write_text("\n".join(lines) + "\n")
    out = subprocess.run(["wrk", f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency",
                          "-s", str(script), url + "/v1/chat/completions"],
                         capture_output=True, text=True, check=True).stdout
    result = {"requests": int(re.search(r"(\d+) requests in", out).group(1)),
              "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
              "errors": 0}
    for pct in ("50", "90", "99"):
        result[f"p{pct}"] = _ms(re.search(rf"\s{pct}%\s+(\S+)", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    result["errors"] = (int(non2xx.group(1)) if non2xx else 0) + (sum(map(int, sock.groups())) if sock else 0)
    return result
