"""Operations: SIGHUP reload and log reopening, SIGTERM drain, the admin API, what the results log holds."""

from __future__ import annotations

import base64
import os
import signal
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from proxy.proxytools import FAST, body, slow, start_sims

from dcu_serving.proxy.results import FIELDS
from support import make_proxy, sse, wait_until


def name(sim) -> str:
    return f"127.0.0.1:{sim.port}"


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return False
    except OSError:
        return True


@pytest.mark.parametrize("abstract", [False, True], ids=["socket file", "abstract socket"])
def test_under_systemd_ready_comes_once_the_proxy_serves(start_sim, tmp_path, abstract):
    """The venv unit is Type=notify: `systemctl start dcu-proxy` returns, and the unit is active, when the proxy
    sends READY=1 to $NOTIFY_SOCKET. By then it must listen and have checked its cards: a request sent the moment
    READY arrives, without a retry, finds the card in rotation."""
    sim = start_sim()
    address = f"dcu-proxy-test-{os.getpid()}" if abstract else str(tmp_path / "notify")
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind("\0" + address if abstract else address)
    systemd.settimeout(15)  # the deadline for READY
    proxy = make_proxy(tmp_path, [sim.url])
    proxy.env["NOTIFY_SOCKET"] = "@" + address if abstract else address
    try:
        proxy.start(ready_path=None)
        assert systemd.recv(4096) == b"READY=1"
        status = proxy.lb_status()
        assert (status["healthy"], status["total"]) == (1, 1)
    finally:
        proxy.stop()
        systemd.close()


def test_sighup_reloads_backends_and_settings_without_dropping_in_flight(start_sim, start_proxy):
    old, new = start_sim(*slow(itl_ms=50, tokens=20)), start_sim(*FAST)
    proxy = start_proxy([old.url], backend_concurrency=1)
    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(lambda: sse(proxy.chat(body(stream=True), stream=True)))
        wait_until(lambda: proxy.backend(old)["active"] == 1, 10, what="a stream on the old card")
        proxy.rewrite_config(backends=[new.url], backend_concurrency=3)
        proxy.signal(signal.SIGHUP)
        wait_until(lambda: [(b["url"], b["healthy"], b["cap"]) for b in proxy.lb_status()["backends"]]
                   == [(new.url, True, 3)], 5, what="the new backend list in force")
        r = proxy.chat(body())
        assert r.status_code == 200 and r.headers["X-Backend"] == name(new)
        events = stream.result()
    assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
    assert proxy.results(count=2)[0]["status"] == 200


def test_a_bad_reload_keeps_the_running_configuration(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url])
    proxy.rewrite_config(queue_size=-1)
    proxy.signal(signal.SIGHUP)
    wait_until(lambda: "reload failed" in proxy.tail(), 5, what="the reload error logged")
    assert "queue_size: must be between 0 and 100000" in proxy.tail()
    assert proxy.chat(body()).status_code == 200
    assert proxy.proc.poll() is None


def test_sighup_reopens_the_results_log_for_rotation(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url])
    for i in range(2):
        assert proxy.chat(body(), headers={"X-Request-Id": f"before-{i}"}).status_code == 200
    proxy.results(count=2)
    rotated = proxy.results_path.with_suffix(".jsonl.1")
    proxy.results_path.rename(rotated)
    proxy.signal(signal.SIGHUP)
    wait_until(proxy.results_path.exists, 5, what="a fresh results log")
    for i in range(3):
        assert proxy.chat(body(), headers={"X-Request-Id": f"after-{i}"}).status_code == 200
    assert [line["request_id"] for line in proxy.results(count=3)] == ["after-0", "after-1", "after-2"]
    assert [line.split('"request_id":"')[1][:8] for line in rotated.read_text().splitlines()] == \
        ["before-0", "before-1"]


def test_sigterm_stops_accepting_and_lets_in_flight_requests_finish(start_sim, start_proxy):
    sim = start_sim(*slow(itl_ms=50, tokens=20))
    proxy = start_proxy([sim.url])
    with ThreadPoolExecutor(1) as pool:
        r = proxy.chat(body(stream=True), stream=True, headers={"X-Request-Id": "in-flight"})
        lines = r.iter_lines()
        next(lines)
        proxy.signal(signal.SIGTERM)
        wait_until(lambda: refuses_connections(proxy.port), 5, what="the listener closed")
        rest = pool.submit(lambda: list(lines))
        assert rest.result(timeout=10)[-2] == b"data: [DONE]"
    assert proxy.proc.wait(10) == 0
    assert [(line["request_id"], line["status"]) for line in proxy.results()] == [("in-flight", 200)]


def test_sigterm_cuts_what_outlasts_the_grace_period(start_sim, start_proxy):
    sim = start_sim(*slow(itl_ms=100, tokens=60))
    proxy = start_proxy([sim.url], shutdown_grace=0.5)
    r = proxy.chat(body(stream=True), stream=True, headers={"X-Request-Id": "too-long"})
    lines = r.iter_lines()
    next(lines)
    proxy.signal(signal.SIGTERM)
    assert proxy.proc.wait(5) == 0
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        list(lines)
    line = proxy.results()[0]
    assert (line["request_id"], line["status"]) == ("too-long", 503)
    assert "shutdown_grace" in line["error"]


def test_drain_and_undrain_through_the_local_admin_listener(start_sim, start_proxy):
    a, b = start_sims(start_sim, 2, *slow(itl_ms=20, tokens=20))
    proxy = start_proxy([a.url, b.url])

    def admin(action, backend):
        return requests.post(f"{proxy.admin_url}/__admin/{action}", json={"backend": backend}, timeout=5)

    assert admin("drain", name(b)).json()["draining"] is True
    with ThreadPoolExecutor(1) as pool:
        on_a = pool.submit(proxy.chat, body())  # the only undrained card
        wait_until(lambda: proxy.backend(a)["active"] == 1, 5, what="a request on a")
        admin("undrain", b.url)
        drained = admin("drain", a.url).json()
        assert drained["draining"] is True and drained["active"] == 1  # in flight, allowed to finish
        for _ in range(3):
            assert proxy.chat(body()).headers["X-Backend"] == name(b)
        assert on_a.result().status_code == 200 and on_a.result().headers["X-Backend"] == name(a)
    listing = requests.get(f"{proxy.admin_url}/__admin/backends", timeout=5).json()["backends"]
    assert [(x["url"], x["draining"], x["active"]) for x in listing] == [(a.url, True, 0), (b.url, False, 0)]
    status = proxy.lb_status()
    assert status["healthy"] == 2  # drained is still healthy, and says it is drained (verify counts it out)
    assert [(x["url"], x["draining"]) for x in status["backends"]] == [(a.url, True), (b.url, False)]
    r = admin("drain", "http://127.0.0.1:1")
    assert r.status_code == 404 and a.url in r.json()["error"]["message"]
    assert admin("drain", 17).status_code == 400
    # without a token the admin API exists only on the local listener
    assert requests.post(proxy.url + "/__admin/drain", json={"backend": a.url}, timeout=5).status_code == 404


def test_with_a_token_the_admin_api_is_on_the_main_listener_and_needs_it(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], admin={"listen": None, "token": "s3cret"})
    url = proxy.url + "/__admin/drain"
    r = requests.post(url, json={"backend": sim.url}, timeout=5)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert "admin.token" in r.json()["error"]["message"]
    r = requests.post(url, json={"backend": sim.url}, headers={"Authorization": "Bearer s3cret"}, timeout=5)
    assert r.status_code == 200 and r.json()["draining"] is True
    assert proxy.chat(body()).status_code == 503  # the only card is drained


def test_results_log_lines_hold_the_fields_and_never_the_prompt_or_images(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url])
    marker = "SECRET-PROMPT-7f3a9"
    image = base64.b64encode(b"\x89PNG-not-really-" + marker.encode() * 4).decode()
    content = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}},
               {"type": "text", "text": marker}]
    ok = proxy.chat(body(messages=[{"role": "user", "content": content}]))
    bad = proxy.chat(body(user=4711, messages=[{"role": "user", "content": content}]))
    assert bad.status_code == 400
    lines = proxy.results(count=2)
    text = proxy.results_path.read_text()
    assert marker not in text and image[:40] not in text
    assert all(tuple(line) == FIELDS for line in lines)
    first = lines[0]
    assert first["status"] == ok.status_code and first["orid"] == "10001"
    assert first["backend"] == name(sim) and first["model"] == "MiniCPM-V-4.5" and first["attempts"] == 1
    assert first["time"].endswith("+00:00") and first["latency_ms"] > 0
    assert lines[1]["orid"] == "4711" and lines[1]["status"] == 400
