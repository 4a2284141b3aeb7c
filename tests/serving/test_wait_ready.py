"""vllm-wait-ready, the ExecStartPost of vllm@.service, against the real simulator over HTTP."""

from __future__ import annotations

import subprocess
import sys
import time

from support import REPO, SERVED_MODEL, free_port

WAITER = REPO / "roles" / "dcu_vllm" / "files" / "vllm-wait-ready"


def wait_ready(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(WAITER), *args], capture_output=True, text=True, timeout=timeout)


def test_returns_as_soon_as_the_instance_serves_its_model(start_sim):
    sim = start_sim()
    started = time.monotonic()
    done = wait_ready("--url", sim.url, "--model", SERVED_MODEL, "--timeout", "10")
    assert done.returncode == 0, done.stderr
    assert f"serves {SERVED_MODEL}" in done.stdout
    assert time.monotonic() - started < 5


def test_waits_through_the_model_load_while_connections_are_refused(start_sim):
    sim = start_sim("--sim-load-seconds", "2", wait=False)
    done = wait_ready("--url", sim.url, "--model", SERVED_MODEL, "--timeout", "20", "--interval", "0.1")
    assert done.returncode == 0, done.stderr
    assert "Connection refused" in done.stderr  # it said what it waited for, once


def test_gives_up_at_the_deadline_naming_what_is_missing(start_sim):
    sim = start_sim()
    done = wait_ready("--url", sim.url, "--model", "another-model", "--timeout", "1", "--interval", "0.1")
    assert done.returncode == 1
    assert f"lists {SERVED_MODEL}, not another-model" in done.stderr
    assert "dcu_vllm_start_timeout" in done.stderr


def test_stops_waiting_when_the_main_process_exits():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    started = time.monotonic()
    done = wait_ready("--url", f"http://127.0.0.1:{free_port()}", "--model", SERVED_MODEL, "--timeout", "60",
                      "--pid", str(gone.pid))
    assert done.returncode == 1
    assert f"main process (pid {gone.pid}) exited" in done.stderr
    assert time.monotonic() - started < 5  # at once, not at the 60 s deadline
