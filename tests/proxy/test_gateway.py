"""A host behind a gateway: API calls only from the addresses `gateway.allow` names - carrying the gateway's secret
when `gateway.secret` is set - and a 403 naming the gateway for everyone else; the operations endpoints stay open,
a reload changes who may call, X-Caller is believed only with the secret, and no model server sees the secret."""

from __future__ import annotations

import http.client
import json
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from proxy.proxytools import FAST, body

from dcu_serving.proxy import config as cfg
from support import wait_until

GATEWAY = {"url": "http://gw1.example:4000", "allow": ["127.0.0.2"]}


SECRET = "gw-secret-0123456789abcdef"
SECURED = {**GATEWAY, "allow": ["127.0.0.0/8"], "secret": SECRET}  # loopback allowed: only the secret decides


def call(proxy, source: str, path: str = "/v1/chat/completions", payload: dict | None = None, **headers):
    """One request to the proxy from the local address `source` (every 127.x address is this host's loopback,
    so the proxy sees a caller other than 127.0.0.1 over a real socket)."""
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10, source_address=(source, 0))
    try:
        if payload is None:
            conn.request("GET", path, headers=headers)
        else:
            conn.request("POST", path, json.dumps(payload), {"Content-Type": "application/json", **headers})
        r = conn.getresponse()
        data = r.read()
        is_json = r.getheader("Content-Type", "").startswith("application/json")
        return r.status, dict(r.getheaders()), json.loads(data) if is_json else data
    finally:
        conn.close()


def test_only_the_gateway_may_call_and_others_are_told_where_it_is(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, gateway=GATEWAY)

    status, headers, answer = call(proxy, "127.0.0.1", payload=body())
    assert status == 403 and headers["X-Backend"] == "dcu-proxy"
    assert answer["error"]["type"] == "ForbiddenError"
    assert "through the gateway http://gw1.example:4000 only" in answer["error"]["message"]
    assert call(proxy, "127.0.0.1", "/v1/models")[0] == 403
    assert proxy.backend(sim)["served"] == 0  # nothing reached the card

    status, headers, answer = call(proxy, "127.0.0.2", payload=body())
    assert status == 200 and headers["X-Backend"] == f"127.0.0.1:{sim.port}"
    assert answer["choices"][0]["message"]["content"]
    assert call(proxy, "127.0.0.2", "/v1/models")[0] == 200

    # What operators and monitoring read stays open to them.
    for path in ("/health", "/__lb_status", "/metrics"):
        assert call(proxy, "127.0.0.1", path)[0] == 200, path
    assert "refusing API calls from 127.0.0.1: only the gateway http://gw1.example:4000 may call" in proxy.tail()


def test_a_reload_changes_who_may_call(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, gateway=GATEWAY)
    assert call(proxy, "127.0.0.1", payload=body())[0] == 403
    proxy.rewrite_config(gateway={"url": GATEWAY["url"], "allow": ["127.0.0.0/8"]})
    proxy.signal(signal.SIGHUP)
    wait_until(lambda: call(proxy, "127.0.0.1", payload=body())[0] == 200, 5, what="127.0.0.1 allowed after reload")
    proxy.rewrite_config(gateway=None)
    proxy.signal(signal.SIGHUP)
    wait_until(lambda: call(proxy, "127.0.0.3", payload=body())[0] == 200, 5, what="no gateway: anyone may call")


def results(proxy) -> list[dict]:
    text = proxy.results_path.read_text() if proxy.results_path.exists() else ""
    return [json.loads(line) for line in text.splitlines()]


def test_the_results_log_names_the_caller_only_from_a_call_that_carried_the_gateways_secret(start_sim, start_proxy):
    sim = start_sim(*FAST)
    secured = start_proxy([sim.url], healthy=1, gateway=SECURED)
    by_address = start_proxy([sim.url], healthy=1, gateway=GATEWAY)
    alone = start_proxy([sim.url], healthy=1)
    assert call(secured, "127.0.0.2", payload=body(), Authorization=f"Bearer {SECRET}", **{"X-Caller": "billing"})[0] \
        == 200
    for proxy in (by_address, alone):
        assert call(proxy, "127.0.0.2", payload=body(), **{"X-Caller": "billing"})[0] == 200
    wait_until(lambda: results(secured) and results(by_address) and results(alone), 5, what="a results line on each")
    assert results(secured)[0]["caller"] == "billing"
    # An address proves nothing (any process on the gateway's host, or this one): the header is not believed.
    assert results(by_address)[0]["caller"] is None and results(alone)[0]["caller"] is None


def test_a_call_without_the_gateways_secret_is_refused_even_from_loopback_with_a_forged_caller(start_sim, start_proxy):
    """A process on the serving host itself (a vLLM container on the host network, root) calls the proxy on loopback
    naming a caller: without the secret it is refused and nothing reaches a card; a wrong secret likewise. The
    operations endpoints stay open, and a reload that drops the secret lets loopback in by address again."""
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, gateway=SECURED)
    forged = {"X-Caller": "billing"}
    for headers in ({}, forged, {**forged, "Authorization": "Bearer " + SECRET[:-1] + "X"},
                    {**forged, "Authorization": SECRET}, {**forged, "Authorization": "Basic " + SECRET}):
        status, _, answer = call(proxy, "127.0.0.1", payload=body(), **headers)
        assert status == 403 and "through the gateway http://gw1.example:4000 only" in answer["error"]["message"], \
            headers
    assert call(proxy, "127.0.0.1", "/v1/models")[0] == 403
    assert proxy.backend(sim)["served"] == 0  # nothing reached the card
    for path in ("/health", "/__lb_status", "/metrics"):
        assert call(proxy, "127.0.0.1", path)[0] == 200, path
    assert "refusing API calls from 127.0.0.1 without the gateway's secret (gateway.secret)" in proxy.tail()
    assert SECRET not in proxy.tail()

    assert call(proxy, "127.0.0.1", payload=body(), Authorization=f"bearer {SECRET}")[0] == 200
    proxy.rewrite_config(gateway={"url": GATEWAY["url"], "allow": ["127.0.0.0/8"]})
    proxy.signal(signal.SIGHUP)
    wait_until(lambda: call(proxy, "127.0.0.1", payload=body())[0] == 200, 5, what="loopback by address after reload")


class _Recorder(BaseHTTPRequestHandler):
    """A stand-in model server that answers health and chat and keeps the headers of each chat it gets."""

    def do_GET(self):
        self._answer(b'{"object": "list", "data": [{"id": "MiniCPM-V-4.5", "object": "model"}]}')

    def do_POST(self):
        self.server.seen.append(dict(self.headers))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(json.dumps({"id": "c", "object": "chat.completion", "model": "MiniCPM-V-4.5", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "INV-1"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode())

    def _answer(self, data: bytes):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_the_gateways_secret_never_reaches_a_model_server(start_proxy):
    backend = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    backend.seen = []
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{backend.server_address[1]}"
        proxy = start_proxy([url], healthy=1, gateway=SECURED)
        status, _, answer = call(proxy, "127.0.0.2", payload=body(), Authorization=f"Bearer {SECRET}",
                                 **{"X-Caller": "billing"})
        assert status == 200 and answer["choices"][0]["message"]["content"] == "INV-1"
        [seen] = backend.seen
        assert "Authorization" not in seen and SECRET not in json.dumps(seen)
        assert seen["X-Caller"] == "billing"
    finally:
        backend.shutdown()
        backend.server_close()


BASE = {"backends": ["http://127.0.0.1:8002"], "models": ["m"]}


@pytest.mark.parametrize(("gateway", "key", "reason"), [
    ({"allow": ["10.0.0.5"]}, "gateway.url", "is required with the other gateway key"),
    ({"url": "http://gw:4000"}, "gateway.allow", "is required with the other gateway key"),
    ({"url": "http://gw:4000", "allow": ["gw.example"]}, "gateway.allow[0]", "IP address or network"),
    ({"url": "http://gw:4000", "allow": []}, "gateway.allow", "non-empty list"),
    ({"secret": SECRET}, "gateway.secret", "needs gateway.allow and gateway.url"),
    ({"url": "http://gw:4000", "allow": ["10.0.0.5"], "secret": "short"}, "gateway.secret", "at least 16 characters"),
])
def test_a_bad_gateway_setting_names_the_key(gateway, key, reason):
    with pytest.raises(cfg.ConfigError) as e:
        cfg.build({**BASE, "gateway": gateway})
    assert e.value.key == key and reason in str(e.value)


def test_networks_and_v4_callers_on_a_v6_listener_are_matched():
    c = cfg.build({**BASE, "gateway": {"url": "http://gw:4000", "allow": ["10.20.0.0/24", "fd00::5"]}})
    from dcu_serving.proxy.server import _within
    assert _within("10.20.0.77", c.gateway_allow) and _within("::ffff:10.20.0.9", c.gateway_allow)
    assert _within("fd00::5", c.gateway_allow)
    assert not _within("10.20.1.1", c.gateway_allow) and not _within(None, c.gateway_allow)
