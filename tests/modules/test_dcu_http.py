"""dcu_http.request: real HTTP against a server in the test; statuses, bodies, errors; no HTTP proxy from the
environment, no credentials from ~/.netrc."""

from __future__ import annotations

import base64
import json

from ansible_collections.dcu.serving.plugins.module_utils import dcu_http
from support import free_port


def test_json_answer_status_and_headers(http_server):
    srv = http_server({"/health": (200, {"ok": True})})
    res = dcu_http.request(srv.url + "/health")
    assert res.ok and res.status == 200 and res.body == {"ok": True} and res.error is None
    assert res.headers["X-Backend"] == "127.0.0.1:8005"


def test_error_status_keeps_its_body(http_server):
    srv = http_server({"/v1/chat/completions": (400, {"error": {"message": "bad model"}})})
    res = dcu_http.request(srv.url + "/v1/chat/completions", method="POST", payload={"model": "x"})
    assert res.status == 400 and not res.ok and res.body["error"]["message"] == "bad model"
    assert json.loads(srv.seen[0]["body"]) == {"model": "x"}
    assert srv.seen[0]["headers"]["Content-Type"] == "application/json"


def test_body_that_is_not_json(http_server):
    srv = http_server({"/metrics": (200, b"vllm_up 1\n")})
    res = dcu_http.request(srv.url + "/metrics")
    assert res.status == 200 and res.body is None and res.raw == b"vllm_up 1\n"


def test_connection_refused_is_said_so():
    res = dcu_http.request(f"http://127.0.0.1:{free_port()}/health", timeout=2)
    assert res.status is None and res.error == "connection refused"


def test_never_through_the_environments_http_proxy(http_server, monkeypatch):
    proxy = http_server({})  # answers 404 to anything: a request through it would not be the backend's 200
    backend = http_server({"/health": (200, {"ok": True})})
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy.url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    res = dcu_http.request(backend.url + "/health")
    assert res.status == 200 and res.body == {"ok": True}
    assert proxy.seen == [] and [s["line"] for s in backend.seen] == ["GET /health HTTP/1.1"]


def test_never_with_credentials_from_netrc(http_server, monkeypatch, tmp_path):
    srv = http_server({"/__lb_status": (200, {"healthy": 0, "total": 0})})
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login admin password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert dcu_http.request(srv.url + "/__lb_status").ok
    assert "Authorization" not in srv.seen[0]["headers"], base64.b64decode(
        srv.seen[0]["headers"]["Authorization"].split()[-1])
