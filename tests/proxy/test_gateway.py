"""A host behind a gateway: API calls only from the addresses `gateway.allow` names, a 403 naming the gateway
for everyone else; the operations endpoints stay open, and a reload changes who may call."""

from __future__ import annotations

import http.client
import json
import signal

import pytest
from proxy.proxytools import FAST, body

from dcu_serving.proxy import config as cfg
from support import wait_until

GATEWAY = {"url": "http://gw1.example:4000", "allow": ["127.0.0.2"]}


def call(proxy, source: str, path: str = "/v1/chat/completions", payload: dict | None = None):
    """One request to the proxy from the local address `source` (every 127.x address is this host's loopback,
    so the proxy sees a caller other than 127.0.0.1 over a real socket)."""
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10, source_address=(source, 0))
    try:
        if payload is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, json.dumps(payload), {"Content-Type": "application/json"})
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


def test_the_results_log_names_the_caller_the_gateway_names_and_only_behind_a_gateway(start_sim, start_proxy):
    sim = start_sim(*FAST)
    behind = start_proxy([sim.url], healthy=1, gateway=GATEWAY)
    alone = start_proxy([sim.url], healthy=1)
    for proxy in (behind, alone):
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10, source_address=("127.0.0.2", 0))
        conn.request("POST", "/v1/chat/completions", json.dumps(body()),
                     {"Content-Type": "application/json", "X-Caller": "billing"})
        assert conn.getresponse().status == 200
        conn.close()
    wait_until(lambda: results(behind) and results(alone), 5, what="a results line on each proxy")
    assert results(behind)[0]["caller"] == "billing"
    # Without a gateway anyone could claim any name: the header is not believed.
    assert results(alone)[0]["caller"] is None


BASE = {"backends": ["http://127.0.0.1:8002"], "models": ["m"]}


@pytest.mark.parametrize(("gateway", "key", "reason"), [
    ({"allow": ["10.0.0.5"]}, "gateway.url", "is required with the other gateway key"),
    ({"url": "http://gw:4000"}, "gateway.allow", "is required with the other gateway key"),
    ({"url": "http://gw:4000", "allow": ["gw.example"]}, "gateway.allow[0]", "IP address or network"),
    ({"url": "http://gw:4000", "allow": []}, "gateway.allow", "non-empty list"),
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
