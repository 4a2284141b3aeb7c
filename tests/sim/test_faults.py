"""Fault injection, at start (flag or environment) and at run time (POST/DELETE /__sim/fault)."""

from __future__ import annotations

import time

import pytest
import requests
from sim.simtools import body, chat

from support import FAST_SIM, http_status, sse, wait_until


def inject(server, **fault) -> dict:
    r = requests.post(server.url + "/__sim/fault", json=fault, timeout=5)
    assert r.status_code == 200, r.text
    return r.json()


def clear(server, kind: str | None = None):
    r = requests.delete(server.url + "/__sim/fault", params={"kind": kind} if kind else None, timeout=5)
    assert r.status_code == 200, r.text


def exited(server, timeout: float = 10) -> int:
    return wait_until(lambda: server.proc.poll() is not None, timeout, what="simulator exit") and \
        server.proc.returncode


def test_error_fault_answers_500_in_vllm_envelope(sim):
    assert inject(sim, kind="error") == {"faults": [{"kind": "error", "status": 500, "every": 1}]}
    r = chat(sim, body(max_tokens=2))
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "InternalServerError"
    clear(sim)
    assert chat(sim, body(max_tokens=2)).status_code == 200


def test_error_every_tenth_completion_fails_one_in_ten(start_sim):
    """A model that answers 10 % of its requests with a 500 and stays healthy (what a canary's soak must catch)."""
    server = start_sim(*FAST_SIM, env={"DCU_SIM_FAULT": "error:status=500:every=10"})
    statuses = [chat(server, body(max_tokens=2)).status_code for _ in range(30)]
    assert [i for i, status in enumerate(statuses) if status != 200] == [9, 19, 29]
    assert {statuses[i] for i in (9, 19, 29)} == {500}
    assert http_status(server.url + "/health") == 200


def test_fail_first_n_then_recover(sim):
    inject(sim, kind="fail_first", count=2, status=503)
    assert [chat(sim, body(max_tokens=2)).status_code for _ in range(4)] == [503, 503, 200, 200]
    assert requests.get(sim.url + "/__sim/fault", timeout=5).json() == {"faults": []}


def test_slow_multiplies_latency(start_sim):
    server = start_sim(*FAST_SIM, "--sim-ttft-ms", "100")

    def duration():
        start = time.monotonic()
        assert chat(server, body(max_tokens=2)).status_code == 200
        return time.monotonic() - start

    normal = duration()
    inject(server, kind="slow", factor=6)
    assert duration() > normal + 0.4


def test_unhealthy_turns_health_503_and_back(sim):
    inject(sim, kind="unhealthy")
    assert http_status(sim.url + "/health") == 503
    assert http_status(sim.url + "/ping") == 503
    clear(sim, "unhealthy")
    assert http_status(sim.url + "/health") == 200


def test_hang_accepts_but_never_answers_until_cleared(sim):
    inject(sim, kind="hang")
    with pytest.raises(requests.ReadTimeout):
        requests.get(sim.url + "/health", timeout=0.5)
    with pytest.raises(requests.ReadTimeout):
        chat(sim, body(max_tokens=2), timeout=0.5)
    clear(sim)
    assert http_status(sim.url + "/health") == 200


def test_crash_exits_the_process(sim):
    inject(sim, kind="crash")
    assert exited(sim) == 1
    assert http_status(sim.url + "/health") is None  # connection refused
    assert "simulated crash" in sim.tail()


def test_crash_mid_stream_cuts_the_stream(sim):
    inject(sim, kind="crash_mid_stream", after_tokens=3)
    lines = []
    with pytest.raises(requests.exceptions.ChunkedEncodingError), \
            chat(sim, body(stream=True), stream=True) as r:
        assert r.status_code == 200
        lines.extend(line for line in r.iter_lines() if line)
    assert len(lines) == 1 + 3  # the role chunk, then exactly 3 tokens; no finish chunk, no [DONE]
    assert b'"finish_reason":null' in lines[-1]
    assert exited(sim) == 1


def test_faults_from_the_command_line(start_sim):
    server = start_sim(*FAST_SIM, "--sim-fault", "unhealthy,fail_first:count=1", wait=False)
    wait_until(lambda: http_status(server.url + "/version") == 200, 15, what="simulator listening")
    assert http_status(server.url + "/health") == 503
    assert chat(server, body(max_tokens=2)).status_code == 500
    assert chat(server, body(max_tokens=2)).status_code == 200


def test_faults_from_the_environment(start_sim):
    server = start_sim(*FAST_SIM, env={"DCU_SIM_FAULT": "error:status=502"})
    assert chat(server, body(max_tokens=2)).status_code == 502


def test_crash_at_start_after_a_delay(start_sim):
    server = start_sim(*FAST_SIM, "--sim-fault", "crash:after_s=0.5")
    assert exited(server) == 1


@pytest.mark.parametrize("fault, says", [
    ({"kind": "explode"}, "unknown fault kind"),
    ({"kind": "slow", "factor": "fast"}, "factor must be a float"),
    ({"kind": "hang", "seconds": 3}, "does not take seconds"),
    ({"kind": "fail_first", "status": 200}, "status must be an HTTP error status"),
    ({"kind": "error", "every": 0}, "every must be positive"),
])
def test_bad_fault_is_a_400_that_says_why(sim, fault, says):
    r = requests.post(sim.url + "/__sim/fault", json=fault, timeout=5)
    assert r.status_code == 400
    assert says in r.json()["error"]["message"]


def test_error_mid_stream_arrives_as_an_event_under_200(sim):
    inject(sim, kind="error_mid_stream", after_tokens=2)
    with chat(sim, body(stream=True), stream=True) as r:
        assert r.status_code == 200
        events = sse(r)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == 500 and "error_mid_stream" in events[-2]["error"]["message"]
    assert len(events) == 1 + 2 + 2  # role, 2 tokens, the error, [DONE]
    whole = chat(sim, body())
    assert whole.status_code == 500 and whole.json()["error"]["type"] == "InternalServerError"
