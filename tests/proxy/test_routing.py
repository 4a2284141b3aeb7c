"""Least-active routing, the proxy's FIFO queue, deadlines and client disconnects — against simulators."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from proxy.proxytools import FAST, body, slow, start_sims

from support import SERVED_MODEL, sse, wait_until


def running(sim) -> float:
    """vllm:num_requests_running of a simulator: the card's busy slots."""
    text = requests.get(sim.url + "/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vllm:num_requests_running")


def active(proxy) -> list[int]:
    return [b["active"] for b in proxy.lb_status()["backends"]]


def test_least_active_spreads_evenly_up_to_the_cap(start_sim, start_proxy):
    sims = start_sims(start_sim, 3, *slow(itl_ms=50, tokens=20))
    proxy = start_proxy([s.url for s in sims], backend_concurrency=2)
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(proxy.chat, body()) for _ in range(6)]
        wait_until(lambda: sum(active(proxy)) == 6, 10, what="6 requests in flight")
        assert active(proxy) == [2, 2, 2]
        wait_until(lambda: [running(s) for s in sims] == [2, 2, 2], 5, what="2 running on every card")
        responses = [f.result() for f in futures]
    assert all(r.status_code == 200 for r in responses)
    assert Counter(r.headers["X-Backend"] for r in responses) == {f"127.0.0.1:{s.port}": 2 for s in sims}
    assert active(proxy) == [0, 0, 0]
    assert [b["served"] for b in proxy.lb_status()["backends"]] == [2, 2, 2]


def test_queue_is_fifo_and_full_means_503_with_retry_after(start_sim, start_proxy):
    sim = start_sim(*slow(itl_ms=30, tokens=20))
    proxy = start_proxy([sim.url], backend_concurrency=1, queue_size=2)
    finished = []

    def send(name):
        r = proxy.chat(body(), headers={"X-Request-Id": name})
        finished.append(name)
        return r

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(send, "a")]
        wait_until(lambda: active(proxy) == [1], 10, what="a in flight")
        futures.append(pool.submit(send, "b"))
        wait_until(lambda: proxy.lb_status()["queue"] == 1, 10, what="b queued")
        futures.append(pool.submit(send, "c"))
        wait_until(lambda: proxy.lb_status()["queue"] == 2, 10, what="c queued")
        full = proxy.chat(body(), headers={"X-Request-Id": "d"})
        assert full.status_code == 503
        assert full.headers["Retry-After"] == "1"
        assert full.headers["X-Backend"] == "dcu-proxy" and full.headers["X-Request-Id"] == "d"
        assert "queue is full" in full.json()["error"]["message"]
        assert full.json()["error"]["type"] == "ServiceUnavailableError"
        assert all(f.result().status_code == 200 for f in futures)
    assert finished == ["a", "b", "c"]
    lines = {line["request_id"]: line for line in proxy.results(count=4)}
    assert lines["d"]["status"] == 503 and lines["d"]["attempts"] == 0
    assert lines["c"]["queue_ms"] > lines["a"]["queue_ms"]


def test_a_queued_request_goes_to_the_first_card_that_frees_a_slot(start_sim, start_proxy):
    sims = start_sims(start_sim, 2, "--sim-ttft-ms", "5", "--sim-itl-ms", "20", "--sim-itl-jitter", "0",
                      "--sim-think-tokens", "0", "--sim-answer-tokens", "400")
    proxy = start_proxy([s.url for s in sims], backend_concurrency=1)
    with ThreadPoolExecutor(3) as pool:
        long = pool.submit(proxy.chat, body(max_tokens=150))  # ~3 s
        wait_until(lambda: sum(active(proxy)) == 1, 10, what="the long request in flight")
        short = pool.submit(proxy.chat, body(max_tokens=5))   # ~0.1 s, on the other card
        wait_until(lambda: sum(active(proxy)) == 2, 10, what="both cards busy")
        queued = pool.submit(proxy.chat, body(max_tokens=5))
        queued_response = queued.result()
        assert not long.done(), "the queued request waited for the long one"
        long_response, short_response = long.result(), short.result()
    assert queued_response.headers["X-Backend"] == short_response.headers["X-Backend"]
    assert long_response.headers["X-Backend"] != short_response.headers["X-Backend"]


def test_deadline_answers_504_and_frees_the_card(start_sim, start_proxy):
    sim = start_sim(*slow(itl_ms=100, tokens=50))
    proxy = start_proxy([sim.url], backend_concurrency=1, request_timeout=1.0)
    with ThreadPoolExecutor(2) as pool:
        working = pool.submit(proxy.chat, body(), headers={"X-Request-Id": "working"})
        wait_until(lambda: active(proxy) == [1], 10, what="one request in flight")
        waiting = pool.submit(proxy.chat, body(), headers={"X-Request-Id": "waiting"})
        r, q = working.result(), waiting.result()
    assert r.status_code == 504 and q.status_code == 504
    assert "Lower max_tokens" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "GatewayTimeoutError"
    assert r.headers["X-Backend"] == f"127.0.0.1:{sim.port}"
    wait_until(lambda: running(sim) == 0, 5, what="the card's slot freed after the deadline")
    lines = {line["request_id"]: line for line in proxy.results(count=2)}
    assert lines["working"]["status"] == 504 and 1000 <= lines["working"]["latency_ms"] < 2000
    # the deadline counts from arrival: the time spent queued behind "working" is part of it
    assert lines["waiting"]["queue_ms"] > 500 and 1000 <= lines["waiting"]["latency_ms"] < 2000


def test_deadline_on_a_started_stream_ends_it_with_an_error_event_and_done(start_sim, start_proxy):
    sim = start_sim(*slow(itl_ms=100, tokens=50))
    proxy = start_proxy([sim.url], request_timeout=1.0)
    r = proxy.chat(body(stream=True), stream=True)
    assert r.status_code == 200
    events = sse(r)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == 504 and "deadline" in events[-2]["error"]["message"]
    assert any(e["choices"] for e in events[:-2]), "content before the deadline was passed on"
    assert proxy.results(count=1)[0]["status"] == 504
    wait_until(lambda: running(sim) == 0, 5, what="the card's slot freed")


def test_client_disconnect_closes_the_upstream_request(start_sim, start_proxy):
    sim = start_sim(*slow(itl_ms=100, tokens=50))
    proxy = start_proxy([sim.url])
    # a stream the caller abandons after the first event
    r = proxy.chat(body(stream=True), stream=True, headers={"X-Request-Id": "gone-stream"})
    lines = r.iter_lines()  # kept: a dropped generator would close the connection already
    next(lines)
    assert running(sim) == 1
    r.close()
    wait_until(lambda: running(sim) == 0 and active(proxy) == [0], 3, what="slot freed after the stream")
    # a whole answer the caller stops waiting for
    started = time.monotonic()
    with pytest.raises(requests.exceptions.ReadTimeout):
        proxy.chat(body(), timeout=0.5, headers={"X-Request-Id": "gone-whole"})
    wait_until(lambda: running(sim) == 0 and active(proxy) == [0], 3, what="slot freed after the timeout")
    assert time.monotonic() - started < 4, "the card stopped long before the 5 s answer would have finished"
    lines = {line["request_id"]: line for line in proxy.results(count=2)}
    assert lines["gone-stream"]["status"] == 499 and lines["gone-whole"]["status"] == 499


def test_request_ids_are_kept_or_made_and_reach_the_card(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url])
    r = proxy.chat(body(), headers={"X-Request-Id": "orid-4711-a"})
    assert r.headers["X-Request-Id"] == "orid-4711-a"
    assert r.json()["id"] == "chatcmpl-orid-4711-a"  # vLLM names the request after the header
    for sent in ({}, {"X-Request-Id": "x" * 200}):  # none, or one too long to keep: the card gets only the new one
        r = proxy.chat(body(), headers=sent)
        rid = r.headers["X-Request-Id"]
        assert len(rid) == 32 and r.json()["id"] == f"chatcmpl-{rid}"


def test_backend_errors_pass_through_unchanged_and_are_not_retried(start_sim, start_proxy):
    sim = start_sim(*FAST, "--sim-fault", "fail_first:count=1:status=500")
    proxy = start_proxy([sim.url])
    r = proxy.chat(body(), headers={"X-Request-Id": "fails"})
    assert r.status_code == 500
    assert r.content == (b'{"error":{"message":"Simulated engine failure (dcu-vllm-sim fault \'fail_first\').",'
                         b'"type":"InternalServerError","param":null,"code":500}}')
    assert r.headers["X-Backend"] == f"127.0.0.1:{sim.port}"
    assert proxy.chat(body()).status_code == 200
    line = proxy.results(count=2)[0]
    assert (line["status"], line["attempts"]) == (500, 1)
    assert line["error"].startswith("Simulated engine failure")
    assert proxy.lb_status()["healthy"] == 1  # an answer, even an error, is not a broken connection


def test_own_endpoints(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], max_model_len=32768)
    r = requests.get(proxy.url + "/v1/models", timeout=5)
    assert [m["id"] for m in r.json()["data"]] == [SERVED_MODEL]
    assert r.json()["data"][0]["max_model_len"] == 32768
    assert r.headers["X-Backend"] == "dcu-proxy" and r.headers["X-Request-Id"]
    for sent, kept in (("mine-1", True), ("x" * 200, False)):  # the same rule as on the API
        r = requests.get(proxy.url + "/health", headers={"X-Request-Id": sent}, timeout=5)
        assert r.status_code == 200 and (r.headers["X-Request-Id"] == sent) == kept
        assert len(r.headers["X-Request-Id"]) <= 128
    r = requests.get(proxy.url + "/v1/nothing", timeout=5)
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    r = requests.get(proxy.url + "/v1/chat/completions", timeout=5)
    assert r.status_code == 405 and r.headers["Allow"] == "POST"
    assert requests.head(proxy.url + "/__lb_status", timeout=5).status_code == 200

    proxy.chat(body())
    proxy.chat(body(user=5))
    assert proxy.chat(body(stream=True)).status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(
        requests.get(proxy.url + "/metrics", timeout=5).text)}
    requests_by_status = {s.labels["status"]: s.value for s in families["dcu_proxy_requests"].samples
                          if s.name == "dcu_proxy_requests_total"}
    assert requests_by_status == {"200": 2.0, "400": 1.0}
    assert any(s.value == 1 for s in families["dcu_proxy_time_to_first_token_seconds"].samples
               if s.name.endswith("_count"))
    latency = {s.name.rsplit("_", 1)[1]: s.value for s in families["dcu_proxy_request_duration_seconds"].samples
               if s.labels.get("le") in (None, "+Inf")}
    assert latency["count"] == latency["bucket"] == 3 and 0 < latency["sum"] < 10
    assert [s.value for s in families["dcu_proxy_backend_healthy"].samples] == [1.0]
    assert [s.labels["backend"] for s in families["dcu_proxy_backend_active"].samples] == [f"127.0.0.1:{sim.port}"]
    assert "dcu_proxy_queue_depth" in families and "dcu_proxy_request_duration_seconds" in families
