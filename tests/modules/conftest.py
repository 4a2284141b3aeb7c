"""Fixtures for the module tests: a fake sysfs tree in real layouts, and running a module as Ansible does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from modules.sysfs import DCU_BDFS, make_sysfs

from support import REPO

SAMPLES = Path(__file__).parent / "samples"
@pytest.fixture
def sample():
    """sample("table_hcu.txt") -> the text of tests/modules/samples/table_hcu.txt."""
    return lambda name: (SAMPLES / name).read_text()


@pytest.fixture
def dcu_bdfs():
    return list(DCU_BDFS)


@pytest.fixture
def fake_sysfs(tmp_path):
    def build(**kwargs) -> Path:
        return make_sysfs(tmp_path / f"sys-{len(list(tmp_path.glob('sys-*')))}", **kwargs)
    return build


def run_module(name: str, args: dict, tmp_path: Path) -> dict:
    """Run plugins/modules/<name>.py as a process with module args, as Ansible does; return its JSON."""
    args_file = tmp_path / f"{name}-args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PYTHONPATH=str(REPO / ".collections"))
    proc = subprocess.run([sys.executable, str(REPO / "plugins" / "modules" / f"{name}.py"), str(args_file)],
                          capture_output=True, text=True, env=env, timeout=60)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{name} printed no JSON (rc {proc.returncode}): {proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1])


@pytest.fixture
def module_runner(tmp_path):
    return lambda name, args: run_module(name, args, tmp_path)


@pytest.fixture
def fake_hy_smi(tmp_path):
    """An executable printing a given sample for each argument list: fake_hy_smi({"--json": "x.txt"})."""
    def build(outputs: dict[str, str | None], rc_missing: int = 1) -> Path:
        table = {key: (SAMPLES / value).read_text() if value else None for key, value in outputs.items()}
        data = tmp_path / "hy-smi-outputs.json"
        data.write_text(json.dumps(table))
        script = tmp_path / "bin" / "hy-smi"
        script.parent.mkdir(exist_ok=True)
        script.write_text(
            f"#!{sys.executable}\n"
            "import json, sys\n"
            f"table = json.load(open({str(data)!r}))\n"
            "out = table.get(' '.join(sys.argv[1:]))\n"
            "if out is None:\n"
            "    print('Error: driver not loaded', file=sys.stderr)\n"
            f"    sys.exit({rc_missing})\n"
            "sys.stdout.write(out)\n"
        )
        script.chmod(0o755)
        return script
    return build


class _Recorder(BaseHTTPRequestHandler):
    """Answers from the server's {path: (status, JSON or bytes)} table (404 otherwise); records each request."""

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.server.seen.append({"line": self.requestline, "headers": dict(self.headers.items()),
                                 "body": self.rfile.read(length)})
        status, answer = self.server.answers.get(self.path, (404, {"error": "no such path"}))
        body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Backend", "127.0.0.1:8005")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    """http_server({path: (status, JSON or bytes)}) -> a real HTTP server on 127.0.0.1 in a thread, with
    .url and .seen (each request's line, headers and body); stopped after the test."""
    started = []

    def start(answers):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        server.answers, server.seen = answers, []
        server.url = f"http://127.0.0.1:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()
