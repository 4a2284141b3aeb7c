"""MinerU's API through dcu-proxy's entrance (`mineru` in proxy.yml): /mineru/file_parse and /mineru/health relayed
to MinerU with the API's trust, MinerU's upload limit, a bounded queue of parses, a deadline, the results line and
the queue's metrics; MinerU's task API (/mineru/tasks) with the same, its queue bounded by MinerU's own /health, its
URLs pointed at the entrance, its ids checked and each task read by its submitter - each over real sockets, with an
aiohttp server standing in for MinerU's API (tests/rag runs MinerU's own)."""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import socket
import threading
import uuid
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
    clear), the task API as MinerU 3.4.5's fast_api.py behaves (POST /tasks saves the upload and answers 202 at once;
    a task waits for one of `workers` parse slots in submission order, pending until it has one, then processing
    until `hold` is set; GET /tasks/{id} and /tasks/{id}/result, with status_url and result_url from the Host it was
    called with) and GET /health with MinerU's fields. Runs its own event loop in a thread."""

    def __init__(self, workers: int = 2):
        self.port = free_port()
        self.workers = workers
        self.hold = threading.Event()
        self.hold.set()
        self.received: list[dict] = []  # per parse or task: its headers and the bytes of its files
        self.active = 0
        self.tasks: dict[str, dict] = {}
        self.task_reads: list[str] = []  # the paths of the GET /tasks/... MinerU was asked
        self.zip = os.urandom(3 << 20)  # the result of a task that asked for a zip
        self._submitted = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the stub did not start"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def states(self) -> list[str]:
        return [task["status"] for task in list(self.tasks.values())]

    def _run(self):
        asyncio.set_event_loop(self._loop)
        self._slots = asyncio.Semaphore(self.workers)  # MinerU's _request_semaphore
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/file_parse", self._parse)
        app.router.add_get("/health", self._health)
        app.router.add_post("/tasks", self._submit)
        app.router.add_get("/tasks/{task_id}", self._status)
        app.router.add_get("/tasks/{task_id}/result", self._result)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    async def _take_upload(self, request: web.Request):
        """The form and its document (None without one, MinerU's 422), the document recorded as received."""
        form = await request.post()
        upload = form.get("files")
        if upload is not None:
            self.received.append({"headers": request.headers.copy(), "files": upload.file.read(),
                                  "backend": form.get("backend")})
        return form, upload

    async def _parse(self, request: web.Request) -> web.Response:
        form, upload = await self._take_upload(request)
        if upload is None:
            return web.json_response({"detail": [{"type": "missing", "loc": ["body", "files"]}]}, status=422)
        self.active += 1
        try:
            await asyncio.to_thread(self.hold.wait)  # released by the test
        finally:
            self.active -= 1
        if form.get("response_format_zip") == "true":  # the zip, its task named in headers (fast_api.py)
            task_id = str(uuid.uuid4())
            return web.Response(body=self.zip, content_type="application/zip", headers={
                "X-MinerU-Task-Id": task_id, "X-MinerU-Task-Status": "completed",
                "X-MinerU-Task-Status-Url": str(request.url.with_path(f"/tasks/{task_id}")),
                "X-MinerU-Task-Result-Url": str(request.url.with_path(f"/tasks/{task_id}/result"))})
        return web.json_response({"backend": form.get("backend"), "version": "3.4.5",
                                  "results": {"doc": {"md_content": MARKDOWN}}})

    async def _health(self, request: web.Request) -> web.Response:
        states = self.states()
        return web.json_response({"status": "healthy", "version": "3.4.5", "protocol_version": 1,
                                  "queued_tasks": states.count("pending"),
                                  "processing_tasks": self.active + states.count("processing"),
                                  "completed_tasks": states.count("completed"), "failed_tasks": 0,
                                  "max_concurrent_requests": self.workers, "task_retention_seconds": 86400})

    # -- the task API, as fast_api.py's AsyncTaskManager --

    def _payload(self, request: web.Request, task: dict) -> dict:
        task_id = task["task_id"]
        payload = {key: task[key] for key in ("task_id", "status", "backend", "file_names", "created_at",
                                              "started_at", "completed_at", "error")}
        payload["status_url"] = str(request.url.with_path(f"/tasks/{task_id}").with_query(None))  # url_for
        payload["result_url"] = str(request.url.with_path(f"/tasks/{task_id}/result").with_query(None))
        return payload

    def _queued_ahead(self, task: dict) -> int:
        if task["status"] != "pending":
            return 0
        return sum(1 for other in self.tasks.values() if other["status"] == "pending" and
                   other["order"] < task["order"])

    async def _submit(self, request: web.Request) -> web.Response:
        form, upload = await self._take_upload(request)
        if upload is None:
            return web.json_response({"detail": [{"type": "missing", "loc": ["body", "files"]}]}, status=422)
        self._submitted += 1
        task = {"task_id": str(uuid.uuid4()), "status": "pending", "backend": form.get("backend"),
                "file_names": [upload.filename.rsplit(".", 1)[0]], "created_at": "2026-12-05T00:00:00+00:00",
                "started_at": None, "completed_at": None, "error": None, "order": self._submitted,
                "zip": form.get("response_format_zip") == "true"}
        self.tasks[task["task_id"]] = task
        asyncio.get_running_loop().create_task(self._process(task))
        payload = self._payload(request, task)
        payload["queued_ahead"] = self._queued_ahead(task)
        payload["message"] = "Task submitted successfully"
        return web.json_response(payload, status=202)

    async def _process(self, task: dict):
        async with self._slots:
            task["status"], task["started_at"] = "processing", "2026-12-05T00:00:01+00:00"
            await asyncio.to_thread(self.hold.wait)
            task["status"], task["completed_at"] = "completed", "2026-12-05T00:00:02+00:00"

    async def _status(self, request: web.Request) -> web.Response:
        self.task_reads.append(request.path)
        task = self.tasks.get(request.match_info["task_id"])
        if task is None:
            return web.json_response({"detail": "Task not found"}, status=404)
        return web.json_response({**self._payload(request, task), "queued_ahead": self._queued_ahead(task)})

    async def _result(self, request: web.Request) -> web.StreamResponse:
        self.task_reads.append(request.path)
        task = self.tasks.get(request.match_info["task_id"])
        if task is None:
            return web.json_response({"detail": "Task not found"}, status=404)
        if task["status"] in ("pending", "processing"):
            return web.json_response({**self._payload(request, task), "message": "Task result is not ready yet"},
                                     status=202)
        if task["zip"]:  # FileResponse: its length known, sent in pieces
            response = web.StreamResponse(headers={"Content-Type": "application/zip", "Content-Disposition":
                                                   f'attachment; filename="{task["task_id"]}.zip"'})
            response.content_length = len(self.zip)
            await response.prepare(request)
            for start in range(0, len(self.zip), 256 << 10):
                await response.write(self.zip[start:start + (256 << 10)])
            await response.write_eof()
            return response
        return web.json_response({"backend": task["backend"], "version": "3.4.5",
                                  "results": {task["file_names"][0]: {"md_content": MARKDOWN}}})

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


def chunked_upload(proxy, path: str) -> requests.Response:
    """A 2 MiB document sent without Content-Length (chunked), orid ORD-CHUNKED."""
    def chunks():
        yield b"--b\r\nContent-Disposition: form-data; name=\"files\"; filename=\"big.pdf\"\r\n\r\n"
        for _ in range(8):
            yield b"x" * (256 << 10)
        yield b"\r\n--b--\r\n"

    return requests.post(proxy.url + path, data=chunks(), timeout=30,
                         headers={"Content-Type": "multipart/form-data; boundary=b", "X-Orid": "ORD-CHUNKED"})


def test_an_upload_over_minerus_limit_is_refused_naming_it(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url, "max_upload_mb": 1})
    big = b"%PDF-1.4 " + b"x" * (2 << 20)

    r = parse(proxy, big, orid="ORD-BIG")  # a declared length: refused before it is read
    assert r.status_code == 413, r.text
    assert "dcu_mineru_max_upload_mb" in r.json()["error"]["message"]

    r = chunked_upload(proxy, "/mineru/file_parse")  # no Content-Length: counted as it passes, refused once over
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


# -- MinerU's task API through the entrance --


def submit(proxy, document: bytes = DOCUMENT, orid: str = "ORD-T", headers: dict | None = None,
           zip_result: bool = False) -> requests.Response:
    return requests.post(proxy.url + "/mineru/tasks", timeout=30,
                         files=[("files", ("invoice.pdf", document, "application/pdf"))],
                         data={"backend": "vlm-http-client", "return_md": "true",
                               "response_format_zip": "true" if zip_result else "false"},
                         headers={"X-Orid": orid, **(headers or {})})


def test_a_task_is_submitted_polled_and_read_through_the_entrance_at_its_urls(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url})
    mineru.hold.clear()

    r = submit(proxy, orid="ORD-77")
    assert r.status_code == 202, r.text
    task = r.json()
    task_id = task["task_id"]
    entrance = f"http://127.0.0.1:{proxy.port}/mineru/tasks/{task_id}"
    assert (task["status_url"], task["result_url"]) == (entrance, entrance + "/result")  # not MinerU's own address
    assert task["queued_ahead"] == 0 and task["message"] == "Task submitted successfully"
    assert r.headers["X-Backend"] == f"127.0.0.1:{mineru.port}"
    (seen,) = mineru.received
    assert seen["files"] == DOCUMENT and seen["headers"]["X-Orid"] == "ORD-77"

    early = requests.get(task["result_url"], timeout=10)  # not parsed yet: MinerU's 202, pointed at the entrance
    assert early.status_code == 202 and early.json()["result_url"] == entrance + "/result", early.text
    mineru.hold.set()
    status = wait_until(lambda: (a := requests.get(task["status_url"], timeout=10).json())["status"] == "completed"
                        and a, 10, what="the task completed")
    assert status["status_url"] == entrance and status["task_id"] == task_id

    result = requests.get(task["result_url"], timeout=10)
    assert result.status_code == 200, result.text
    assert result.json()["results"]["invoice"]["md_content"] == MARKDOWN
    assert mineru.task_reads[-1] == f"/tasks/{task_id}/result"

    lines = proxy.results(3)  # the submission and the two result reads; status polls are counted, not logged
    assert [(line["api"], line["status"], line["task_id"]) for line in lines] == [
        ("parse_task", 202, task_id), ("parse_result", 202, task_id), ("parse_result", 200, task_id)]
    assert lines[0]["orid"] == "ORD-77" and lines[0]["backend"] == f"127.0.0.1:{mineru.port}"
    raw = proxy.results_path.read_text()
    assert "ACME" not in raw and "4711" not in raw and "invoice" not in raw  # no document, no Markdown, no name

    text = metrics(proxy)
    assert metric(text, 'dcu_proxy_requests_total{api="parse_task",model="",status="202"}') == 1
    assert metric(text, 'dcu_proxy_requests_total{api="parse_status",model="",status="200"}') >= 1
    assert metric(text, 'dcu_proxy_requests_total{api="parse_result",model="",status="200"}') == 1
    assert metric(text, "dcu_proxy_mineru_task_submissions") == 0
    assert metric(text, "dcu_proxy_mineru_parse_duration_seconds_count") == 0  # a submission is not a parse


def test_a_zip_result_is_passed_on_as_it_comes(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url})
    task = submit(proxy, zip_result=True).json()
    wait_until(lambda: requests.get(task["status_url"], timeout=10).json()["status"] == "completed", 10,
               what="the task completed")
    result = requests.get(task["result_url"], timeout=30, stream=True)
    assert result.status_code == 200 and result.headers["Content-Type"] == "application/zip"
    assert result.headers.get("Transfer-Encoding") == "chunked"  # passed on in pieces, not held to know its length
    assert result.raw.read() == mineru.zip  # 3 MiB, every byte


def test_a_zip_from_file_parse_names_its_task_at_the_entrance(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url})
    r = requests.post(proxy.url + "/mineru/file_parse", timeout=30, files=[("files", ("a.pdf", DOCUMENT))],
                      data={"response_format_zip": "true"})
    assert r.status_code == 200 and r.content == mineru.zip
    where = f"{proxy.url}/mineru/tasks/{r.headers['X-MinerU-Task-Id']}"
    assert (r.headers["X-MinerU-Task-Status-Url"], r.headers["X-MinerU-Task-Result-Url"]) == (where,
                                                                                              where + "/result")


def test_an_oversized_task_is_refused_naming_the_limit(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url, "max_upload_mb": 1})
    r = submit(proxy, b"%PDF-1.4 " + b"x" * (2 << 20), orid="ORD-BIG")
    assert r.status_code == 413, r.text
    assert "dcu_mineru_max_upload_mb" in r.json()["error"]["message"]

    r = chunked_upload(proxy, "/mineru/tasks")  # no Content-Length: counted as it passes, refused once over
    assert r.status_code == 413, r.text
    assert mineru.received == [] and mineru.tasks == {}  # nothing queued at MinerU
    assert submit(proxy).status_code == 202  # a document within the limit is accepted
    lines = proxy.results(3)
    assert [(line["api"], line["orid"], line["status"]) for line in lines] == [
        ("parse_task", "ORD-BIG", 413), ("parse_task", "ORD-CHUNKED", 413), ("parse_task", "ORD-T", 202)]
    assert metric(metrics(proxy), 'dcu_proxy_mineru_rejected_total{reason="too_large"}') == 2


def test_tasks_beyond_minerus_free_slots_and_the_queue_are_refused_with_retry_after(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, retry_after=9, mineru={"url": mineru.url, "queue_size": 1})
    mineru.hold.clear()
    first, second = submit(proxy, orid="ORD-1"), submit(proxy, orid="ORD-2")  # MinerU's two workers take them
    assert first.status_code == 202 and second.status_code == 202
    wait_until(lambda: mineru.states() == ["processing", "processing"], 10, what="two tasks in parse")
    third = submit(proxy, orid="ORD-3")  # waits at MinerU: one, as mineru.queue_size allows
    assert third.status_code == 202 and third.json()["queued_ahead"] == 0

    fourth = submit(proxy, orid="ORD-4")
    assert fourth.status_code == 503 and fourth.headers["Retry-After"] == "9", fourth.text
    message = fourth.json()["error"]["message"]
    assert "1 tasks queued and 2 in parse" in message and "mineru.queue_size 1" in message
    assert len(mineru.received) == 3 and len(mineru.tasks) == 3  # the refused document never reached MinerU

    mineru.hold.set()
    wait_until(lambda: mineru.states() == ["completed"] * 3, 10, what="the three tasks completed")
    assert submit(proxy, orid="ORD-5").status_code == 202  # room again
    assert metric(metrics(proxy), 'dcu_proxy_mineru_rejected_total{reason="queue_full"}') == 1
    lines = {line["orid"]: line for line in proxy.results(5)}
    assert lines["ORD-4"]["status"] == 503 and lines["ORD-4"]["backend"] is None


def test_with_no_queue_a_task_goes_in_only_to_a_free_worker(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url, "queue_size": 0})
    mineru.hold.clear()
    assert [submit(proxy).status_code for _ in range(2)] == [202, 202]
    wait_until(lambda: mineru.states() == ["processing", "processing"], 10, what="two tasks in parse")
    assert submit(proxy).status_code == 503
    assert len(mineru.tasks) == 2


def test_a_task_id_not_minerus_is_refused_before_minerU(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url})
    known = str(uuid.uuid4())
    for path in ("not-a-task", known.upper(), known + "x", "%2e%2e%2fhealth", "..%2f..%2ffile_parse",
                 f"{known}%2F..%2F..%2Fhealth", "", f"{known}/../../health"):
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)  # sends the path as written
        conn.request("GET", f"/mineru/tasks/{path}", headers={"X-Orid": "ORD-BAD"})
        answer = conn.getresponse()
        body = answer.read()
        conn.close()
        assert answer.status in (400, 404), (path, answer.status, body)
        if answer.status == 400:
            assert b"lowercase UUID4" in body, (path, body)
    assert mineru.task_reads == []  # none reached MinerU

    r = requests.get(f"{proxy.url}/mineru/tasks/{known}/status", timeout=10)
    assert r.status_code == 404 and f"/mineru/tasks/{known}/result" in r.json()["error"]["message"]
    r = requests.get(f"{proxy.url}/mineru/tasks/{known}", timeout=10)  # well formed, unknown: MinerU's own 404
    assert r.status_code == 404 and r.json() == {"detail": "Task not found"}
    assert mineru.task_reads == [f"/tasks/{known}"]
    assert metric(metrics(proxy), 'dcu_proxy_mineru_rejected_total{reason="bad_task_id"}') >= 5


def test_only_the_gateway_may_use_tasks_and_a_caller_reads_only_its_own(start_sim, start_proxy, mineru):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url},
                        gateway={"url": "http://gw1.example:4000", "allow": ["127.0.0.0/8"], "secret": SECRET})
    r = submit(proxy)
    assert r.status_code == 403 and "gw1.example" in r.json()["error"]["message"]
    assert requests.get(f"{proxy.url}/mineru/tasks/{uuid.uuid4()}", timeout=5).status_code == 403
    assert mineru.received == [] and mineru.task_reads == []

    def as_caller(caller: str) -> dict:
        return {"Authorization": f"Bearer {SECRET}", "X-Caller": caller}

    r = submit(proxy, headers=as_caller("crm"))
    assert r.status_code == 202, r.text
    task = r.json()
    (seen,) = mineru.received
    assert "Authorization" not in seen["headers"]  # the gateway's secret stops here
    wait_until(lambda: requests.get(task["status_url"], headers=as_caller("crm"), timeout=10).json()["status"]
               == "completed", 10, what="the task completed")

    for url in (task["status_url"], task["result_url"]):
        other = requests.get(url, headers=as_caller("erp"), timeout=10)
        assert other.status_code == 404 and "X-Caller" in other.json()["error"]["message"], other.text
    reads = len(mineru.task_reads)
    own = requests.get(task["result_url"], headers=as_caller("crm"), timeout=10)
    assert own.status_code == 200 and own.json()["results"]["invoice"]["md_content"] == MARKDOWN
    assert len(mineru.task_reads) == reads + 1  # the other caller's reads never reached MinerU

    lines = proxy.results(3)  # the 403s are the gateway check's, before any API (as for the model APIs)
    assert [(line["api"], line["caller"], line["status"]) for line in lines] == [
        ("parse_task", "crm", 202), ("parse_result", "erp", 404), ("parse_result", "crm", 200)]
    assert metric(metrics(proxy), 'dcu_proxy_mineru_rejected_total{reason="not_owner"}') == 2


def test_task_urls_name_the_gateways_entrance_only_when_the_gateway_says_so(start_sim, start_proxy, mineru):
    """X-MinerU-Entrance (the gateway's path to this host) is believed from a call carrying the gateway's secret, and
    ignored where no gateway is configured: a caller cannot point another's task URLs elsewhere."""
    sim = start_sim(*FAST)
    elsewhere = {"X-MinerU-Entrance": "https://evil.example/mineru/x"}
    alone = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url})
    task = submit(alone, headers=elsewhere).json()
    assert task["status_url"] == f"http://127.0.0.1:{alone.port}/mineru/tasks/{task['task_id']}"

    behind = start_proxy([sim.url], healthy=1, mineru={"url": mineru.url},
                         gateway={"url": "http://gw1.example:4000", "allow": ["127.0.0.0/8"], "secret": SECRET})
    gateway = {"Authorization": f"Bearer {SECRET}", "X-Caller": "crm",
               "X-MinerU-Entrance": "https://gw1.example:4000/mineru/host1"}
    task = submit(behind, headers=gateway).json()
    at = f"https://gw1.example:4000/mineru/host1/tasks/{task['task_id']}"
    assert (task["status_url"], task["result_url"]) == (at, at + "/result")
    status = requests.get(f"{behind.url}/mineru/tasks/{task['task_id']}", headers=gateway, timeout=10).json()
    assert status["status_url"] == at
