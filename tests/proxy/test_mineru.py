"""MinerU's API through dcu-proxy's entrance (`mineru` in proxy.yml): /mineru/file_parse and /mineru/health relayed
to MinerU with the API's trust, MinerU's upload limit, a bounded queue of parses, a deadline, the results line and
the queue's metrics - each over real sockets, with an aiohttp server standing in for MinerU's API (tests/rag runs
MinerU's own)."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from aiohttp import web
from proxy.proxytools import FAST

from support import free_port, wait_until

DOCUMENT = b"%PDF-1.4 the quarterly invoice of ACME, total 4711 " * 2000  # ~100 kB; never in a log line
MARKDOWN = "# Invoice\n\nACME owes 4711."


class StubMinerU:
    """MinerU's API as far as the entrance uses it: POST /file_parse (a form with `files`; held while `hold` is
    clear) and GET /health with MinerU's fields. Runs its own event loop in a thread."""

    def __init__(self):
        self.port = free_port()
        self.hold = threading.Event()
        self.hold.set()
        self.received: list[dict] = []  # per parse: its headers and the bytes of its files
        self.active = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the stub did not start"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self):
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/file_parse", self._parse)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    async def _parse(self, request: web.Request) -> web.Response:
        form = await request.post()
        upload = form.get("files")
        if upload is None:
            return web.json_response({"detail": [{"type": "missing", "loc": ["body", "files"]}]}, status=422)
        self.received.append({"headers": request.headers.copy(), "files": upload.file.read(),
                              "backend": form.get("backend")})
        self.active += 1
        try:
            await asyncio.to_thread(self.hold.wait)  # released by the test
        finally:
            self.active -= 1
        return web.json_response({"backend": form.get("backend"), "version": "3.4.5",
                                  "results": {"doc": {"md_content": MARKDOWN}}})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy", "version": "3.4.5", "protocol_version": 1, "queued_tasks": 0,
                                  "processing_tasks": self.active, "max_concurrent_requests": 2})

    def stop(self):
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def mineru():
    stub = StubMinerU()
    yield stub
    stub.hold.set()
    stub.stop()


def parse(proxy, document: bytes = DOCUMENT, orid: str = "ORD-1", headers: dict | None = None,
          timeout: float = 30) -> requests.Response:
    return requests.post(proxy.url + "/mineru/file_parse", timeout=timeout,
                         files=[("files", ("invoice.pdf", document, "application/pdf"))],
                         data={"backend": "vlm-http-client", "return_md": "true"},
                         headers={"X-Orid": orid, **(headers or {})})


def metrics(proxy) -> str:
    return requests.get(proxy.url + "/metrics", timeout=5).text


def metric(text: str, name: str) -> float | None:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def test_a_parse_is_relayed_recorded_and_measured(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url, "concurrency": 2})

    r = parse(proxy, orid="ORD-42")
    assert r.status_code == 200, r.text
    assert r.json()["results"]["doc"]["md_content"] == MARKDOWN
    assert r.headers["X-Backend"] == f"127.0.0.1:{mineru.port}"
    (seen,) = mineru.received
    assert seen["files"] == DOCUMENT  # passed on whole and unchanged
    assert seen["backend"] == "vlm-http-client"
    assert seen["headers"]["X-Request-Id"] == r.headers["X-Request-Id"]

    health = requests.get(proxy.url + "/mineru/health", timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "healthy"

    (line,) = proxy.results(1)
    assert {k: line[k] for k in ("api", "orid", "status", "backend", "attempts", "error")} == {
        "api": "parse", "orid": "ORD-42", "status": 200, "backend": f"127.0.0.1:{mineru.port}", "attempts": 1,
        "error": None}
    raw = proxy.results_path.read_text()
    assert "ACME" not in raw and "4711" not in raw and "invoice" not in raw  # no document, no Markdown, no name

    text = metrics(proxy)
    assert metric(text, 'dcu_proxy_requests_total{api="parse",model="",status="200"}') == 1
    assert metric(text, "dcu_proxy_mineru_parse_duration_seconds_count") == 1
    assert metric(text, "dcu_proxy_mineru_concurrency") == 2
    assert metric(text, "dcu_proxy_mineru_max_upload_bytes") == 100 * 2**20
    assert metric(text, "dcu_proxy_request_duration_seconds_count") == 0  # the model APIs' latency stays theirs
    wait_until(lambda: metric(metrics(proxy), "dcu_proxy_mineru_healthy") == 1, 5, what="MinerU's health polled")
    assert proxy.lb_status()["mineru"]["url"] == mineru.url


def test_without_the_entrance_the_paths_say_how_to_turn_it_on(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1)
    r = parse(proxy)
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "mineru.url" in message and "dcu_mineru_entrance: proxy" in message
    assert requests.get(proxy.url + "/mineru/health", timeout=5).status_code == 404
    assert "mineru" not in proxy.lb_status()
    assert "dcu_proxy_mineru_parses_waiting" not in metrics(proxy)
    (line,) = proxy.results(1)
    assert line["api"] == "parse" and line["status"] == 404


def test_an_upload_over_minerus_limit_is_refused_naming_it(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url, "max_upload_mb": 1})
    big = b"%PDF-1.4 " + b"x" * (2 << 20)

    r = parse(proxy, big, orid="ORD-BIG")  # a declared length: refused before it is read
    assert r.status_code == 413, r.text
    assert "dcu_mineru_max_upload_mb" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: counted as it passes, refused once over
        yield b"--b\r\nContent-Disposition: form-data; name=\"files\"; filename=\"big.pdf\"\r\n\r\n"
        for _ in range(8):
            yield b"x" * (256 << 10)
        yield b"\r\n--b--\r\n"

    r = requests.post(proxy.url + "/mineru/file_parse", data=chunks(), timeout=30,
                      headers={"Content-Type": "multipart/form-data; boundary=b", "X-Orid": "ORD-CHUNKED"})
    assert r.status_code == 413, r.text
    assert mineru.received == []  # MinerU parsed nothing
    assert parse(proxy).status_code == 200  # a document within the limit passes

    lines = proxy.results(3)
    assert [(line["orid"], line["status"]) for line in lines] == [("ORD-BIG", 413), ("ORD-CHUNKED", 413),
                                                                  ("ORD-1", 200)]
    assert metric(metrics(proxy), 'dcu_proxy_mineru_rejected_total{reason="too_large"}') == 2


def test_a_full_queue_is_refused_with_retry_after_and_waiting_parses_go_in_turn(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, retry_after=7,
                        mineru={"url": mineru.url, "concurrency": 1, "queue_size": 1})
    mineru.hold.clear()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(parse, proxy, orid="ORD-A")
        wait_until(lambda: mineru.active == 1, 10, what="the first parse at MinerU")
        second = pool.submit(parse, proxy, orid="ORD-B")
        wait_until(lambda: metric(metrics(proxy), "dcu_proxy_mineru_parses_waiting") == 1, 10,
                   what="the second parse waiting")
        text = metrics(proxy)
        assert metric(text, "dcu_proxy_mineru_parses_in_flight") == 1
        assert metric(text, 'dcu_proxy_mineru_tasks{state="processing"}') in (0, 1)  # as MinerU's /health said

        third = parse(proxy, orid="ORD-C")
        assert third.status_code == 503 and third.headers["Retry-After"] == "7"
        assert "queue_size 1" in third.json()["error"]["message"]
        assert len(mineru.received) == 1  # the waiting one was not sent on: MinerU holds one document

        mineru.hold.set()
        assert first.result().status_code == 200 and second.result().status_code == 200
    assert len(mineru.received) == 2
    text = metrics(proxy)
    assert metric(text, 'dcu_proxy_mineru_rejected_total{reason="queue_full"}') == 1
    assert metric(text, "dcu_proxy_mineru_queue_wait_seconds_count") == 2  # the two that got a slot, not the refused
    assert metric(text, "dcu_proxy_mineru_parses_in_flight") == 0
    lines = {line["orid"]: line for line in proxy.results(3)}
    assert lines["ORD-C"]["status"] == 503 and lines["ORD-C"]["backend"] is None
    assert lines["ORD-B"]["queue_ms"] > lines["ORD-A"]["queue_ms"]  # it waited for A's slot


def test_a_parse_past_its_deadline_is_a_504(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url, "timeout": 1})
    mineru.hold.clear()
    r = parse(proxy)
    assert r.status_code == 504 and "mineru.timeout" in r.json()["error"]["message"]
    (line,) = proxy.results(1)
    assert line["status"] == 504 and 900 <= line["latency_ms"] < 5000


SECRET = "gw-secret-0123456789abcdef"


def test_only_the_gateway_may_parse_and_minerU_never_sees_its_secret(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url},
                        gateway={"url": "http://gw1.example:4000", "allow": ["127.0.0.0/8"], "secret": SECRET})
    r = parse(proxy)
    assert r.status_code == 403 and "gw1.example" in r.json()["error"]["message"]
    assert requests.get(proxy.url + "/mineru/health", timeout=5).status_code == 403
    assert mineru.received == []

    r = parse(proxy, headers={"Authorization": f"Bearer {SECRET}", "X-Caller": "crm"})
    assert r.status_code == 200, r.text
    (seen,) = mineru.received
    assert "Authorization" not in seen["headers"]
    assert requests.get(proxy.url + "/mineru/health", timeout=5,
                        headers={"Authorization": f"Bearer {SECRET}"}).status_code == 200
    (line,) = proxy.results(1)
    assert line["caller"] == "crm" and line["status"] == 200


def test_a_waiting_parse_holds_no_body_and_expect_continue_comes_with_its_slot(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url, "concurrency": 1, "queue_size": 4})
    mineru.hold.clear()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(parse, proxy, orid="ORD-A")
        wait_until(lambda: mineru.active == 1, 10, what="the first parse at MinerU")
        form = (b"--b\r\nContent-Disposition: form-data; name=\"files\"; filename=\"a.pdf\"\r\n\r\n%PDF-1.4 "
                b"\r\n--b--\r\n")
        s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        s.sendall(b"POST /mineru/file_parse HTTP/1.1\r\nHost: p\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                  b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(form))
        wait_until(lambda: metric(metrics(proxy), "dcu_proxy_mineru_parses_waiting") == 1, 10,
                   what="the second parse waiting")
        s.settimeout(0.3)
        with pytest.raises(TimeoutError):  # no 100 Continue while it waits: the body stays with the caller
            s.recv(100)
        mineru.hold.set()
        s.settimeout(10)
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(form)
        answer = b""
        while b"md_content" not in answer:
            chunk = s.recv(65536)
            assert chunk, answer
            answer += chunk
        s.close()
        assert b"HTTP/1.1 200 OK" in answer
        assert first.result().status_code == 200
    assert [seen["files"] for seen in mineru.received] == [DOCUMENT, b"%PDF-1.4 "]
