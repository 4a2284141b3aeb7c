"""Backends that die, hang or report sick: ejection, re-admission, retries, 502/503 — and kill one of 8."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import requests
from proxy.proxytools import FAST, body, slow, start_sims

from support import sse, wait_until


def name(sim) -> str:
    return f"127.0.0.1:{sim.port}"


def set_fault(sim, **fault):
    requests.post(sim.url + "/__sim/fault", json=fault, timeout=5).raise_for_status()


def clear_faults(sim):
    requests.delete(sim.url + "/__sim/fault", timeout=5).raise_for_status()


def test_a_request_whose_connect_failed_is_retried_on_another_card(start_sim, start_proxy):
    sims = start_sims(start_sim, 2, "--sim-ttft-ms", "5", "--sim-itl-ms", "20", "--sim-itl-jitter", "0",
                      "--sim-think-tokens", "0", "--sim-answer-tokens", "400")
    # health checks far apart: the proxy learns of the death only from the failed connect
    proxy = start_proxy([s.url for s in sims], backend_concurrency=1, health={"interval": 60, "timeout": 1})
    with ThreadPoolExecutor(1) as pool:
        busy_request = pool.submit(proxy.chat, body(max_tokens=25))  # ~0.5 s on one card
        wait_until(lambda: sum(b["active"] for b in proxy.lb_status()["backends"]) == 1, 10, what="busy")
        busy = next(s for s in sims if proxy.backend(s)["active"] == 1)
        victim = next(s for s in sims if s is not busy)
        victim.proc.kill()
        victim.proc.wait()
        r = proxy.chat(body(max_tokens=5), headers={"X-Request-Id": "retried"})  # least active: the dead one
        assert busy_request.result().status_code == 200
    assert r.status_code == 200, r.text
    assert r.headers["X-Backend"] == name(busy)
    line = next(line for line in proxy.results(count=2) if line["request_id"] == "retried")
    assert (line["status"], line["attempts"], line["backend"]) == (200, 2, name(busy))
    dead = proxy.backend(victim)
    assert not dead["healthy"] and "cannot connect" in dead["last_error"]


def test_a_card_dying_mid_answer_gives_502_and_is_ejected(start_sim, start_proxy):
    sims = start_sims(start_sim, 2, *FAST, "--sim-fault", "crash_mid_stream:after_tokens=3")
    proxy = start_proxy([s.url for s in sims], health={"interval": 30, "timeout": 1})
    r = proxy.chat(body(stream=True), stream=True, headers={"X-Request-Id": "stream"})
    assert r.status_code == 200
    events = sse(r)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 502
    assert "Safe to retry" in events[-2]["error"]["message"]
    first = r.headers["X-Backend"]
    r = proxy.chat(body(), headers={"X-Request-Id": "whole"})  # the other card: the first is ejected
    assert r.status_code == 502 and r.json()["error"]["type"] == "BadGatewayError"
    assert r.headers["X-Backend"] != first
    status = proxy.lb_status()
    assert status["healthy"] == 0 and all("broke" in b["last_error"] for b in status["backends"])
    lines = {line["request_id"]: line for line in proxy.results(count=2)}
    assert lines["stream"]["status"] == 502 and lines["whole"]["status"] == 502
    r = proxy.chat(body())
    assert r.status_code == 503 and r.headers["Retry-After"]
    assert requests.get(proxy.url + "/health", timeout=5).status_code == 503


def test_a_sick_or_hung_card_is_ejected_by_health_checks_and_readmitted(start_sim, start_proxy):
    sims = start_sims(start_sim, 2, *FAST)
    proxy = start_proxy([s.url for s in sims], health={"interval": 0.5, "timeout": 0.3})
    sick, fine = sims
    for fault, reason in (({"kind": "unhealthy"}, "/health answered 503"),
                          ({"kind": "hang"}, "did not answer within 0.3 s")):
        set_fault(sick, **fault)
        wait_until(lambda: not proxy.backend(sick)["healthy"], 1.5, what="ejected within an interval")
        assert reason in proxy.backend(sick)["last_error"]
        for _ in range(4):
            r = proxy.chat(body())
            assert r.status_code == 200 and r.headers["X-Backend"] == name(fine)
        clear_faults(sick)
        wait_until(lambda: proxy.backend(sick)["healthy"], 1.5, what="back within an interval")
        assert proxy.backend(sick)["last_error"] is None
    assert proxy.backend(sick)["failures"] >= 2


async def _poll(predicate, timeout: float, what: str):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await loop.run_in_executor(None, predicate)
        if value:
            return value
        if loop.time() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.02)


async def test_kill_one_of_eight_under_load(start_sim, start_proxy):
    sim_args = slow(itl_ms=10, tokens=15)
    sims = start_sims(start_sim, 8, *sim_args)
    interval = 1.0
    proxy = start_proxy([s.url for s in sims], health={"interval": interval, "timeout": 0.5})
    victim = sims[3]
    loop = asyncio.get_running_loop()
    sent: list[tuple] = []  # (request id, started, finished, status, X-Backend)
    stop = asyncio.Event()

    async def caller(n: int):
        async with aiohttp.ClientSession() as session:
            i = 0
            while not stop.is_set():
                rid, started = f"c{n}-{i}", loop.time()
                i += 1
                try:
                    async with session.post(proxy.url + "/v1/chat/completions", json=body(),
                                            headers={"X-Request-Id": rid}) as r:
                        await r.read()
                        sent.append((rid, started, loop.time(), r.status, r.headers.get("X-Backend")))
                except aiohttp.ClientError:
                    sent.append((rid, started, loop.time(), None, None))

    callers = [asyncio.ensure_future(caller(n)) for n in range(24)]
    await _poll(lambda: len(sent) >= 60 and any(s[4] == name(victim) for s in sent), 20, what="load")
    victim.proc.kill()
    await loop.run_in_executor(None, victim.proc.wait)
    killed_at = loop.time()  # dead, its sockets closed: whatever is sent from now on never reaches it
    await _poll(lambda: not proxy.backend(victim)["healthy"], interval, what="the killed card unhealthy")
    await _poll(lambda: len(sent) >= 60 + 100, 20, what="load after the kill")

    await loop.run_in_executor(None, lambda: start_sim(*sim_args, port=victim.port))
    back_at = loop.time()
    await _poll(lambda: proxy.backend(victim)["healthy"], interval + 0.5, what="the card back in rotation")
    await _poll(lambda: any(s[1] > back_at and s[4] == name(victim) for s in sent), 10,
                what="traffic on the restarted card")
    stop.set()
    await asyncio.gather(*callers)

    failed = [s for s in sent if s[3] != 200]
    for rid, started, _, status, backend in failed:
        # only requests already on the card when it died may fail, and only with 502
        assert (status, backend) == (502, name(victim)), (rid, status, backend)
        assert started < killed_at, f"{rid} was sent after the kill and still failed"
    assert len(failed) <= 4  # at most the card's 4 slots
    lines = await loop.run_in_executor(None, lambda: proxy.results(count=len(sent), timeout=10))
    assert sorted(line["request_id"] for line in lines) == sorted(s[0] for s in sent)


def test_answers_of_500_and_more_are_counted_per_backend_and_model(start_sim, start_proxy):
    """A card that answers some requests with a 500 but stays healthy (what a canary's soak must see): its errors
    are counted under its name and model, in /metrics and /__lb_status; a 4xx, and the proxy's own 503, are not."""
    from prometheus_client.parser import text_string_to_metric_families

    sick, well = start_sims(start_sim, 2, *FAST)
    proxy = start_proxy([sick.url, well.url], healthy=2)
    set_fault(sick, kind="error", status=500)
    statuses = [proxy.chat(body()).status_code for _ in range(16)]
    assert statuses.count(500) >= 1 and set(statuses) <= {200, 500}, statuses
    clear_faults(sick)
    assert proxy.chat(body(max_tokens=-1)).status_code == 400  # the caller's mistake, not the card's
    assert proxy.chat(body(model="gpt-4o")).status_code == 404
    status = {b["url"]: b for b in proxy.lb_status()["backends"]}
    assert status[sick.url]["errors"] == statuses.count(500) and status[well.url]["errors"] == 0
    assert status[sick.url]["healthy"]  # answering 500 does not eject it: only the count tells
    metrics = requests.get(proxy.url + "/metrics", timeout=5).text
    counted = {(s.labels["backend"], s.labels["model"]): s.value
               for family in text_string_to_metric_families(metrics) if family.name == "dcu_proxy_backend_errors"
               for s in family.samples if s.name.endswith("_total")}
    assert counted == {(name(sick), body()["model"]): statuses.count(500)}
