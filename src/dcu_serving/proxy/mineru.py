"""MinerU's API through the proxy's entrance (`mineru` in proxy.yml; docs/proxy.md, "MinerU").

With `mineru.url` set, the main listener relays `POST /mineru/file_parse` (MinerU's synchronous parse: a form with
the documents in, the result once parsed), MinerU's task API (`POST /mineru/tasks`, `GET /mineru/tasks/{id}` and
`/mineru/tasks/{id}/result`) and `GET /mineru/health` to MinerU's API, with what the model APIs get:

- the API's callers only (the server wraps these handlers in its gateway check; the gateway's secret stops here);
- MinerU's upload limit, `max_upload_mb`, for a parse and a task alike: a declared length over it is a 413 before a
  byte is read, a body without one is counted as it passes (MinerU's launcher enforces the same limit behind us);
- `concurrency` parses in flight at MinerU, `queue_size` more waiting in arrival order, a 503 with Retry-After
  beyond. A waiting parse's body is not read until it has its slot (Expect: 100-continue is answered then), so
  the queue holds no documents here; then the upload is passed on as it arrives (relay.Upload), never held whole;
- `timeout` from arrival to the answer's end, queue included (504), and 408 for a body that stops arriving;
- one results-log line (api `parse`; the orid from the X-Orid header, as a form's documents carry no `user`; the
  error MinerU gave, never a byte of the document or of its Markdown) and metrics of the queue (metrics.py).

The task API. A submission returns once MinerU has saved the upload, so the parse slots above cannot bound it, and
MinerU bounds nothing itself: its AsyncTaskManager puts every accepted task in an unbounded asyncio.Queue with its
upload already on disk (MINERU_API_OUTPUT_ROOT), and parses max_concurrent_requests at once. So before a submission's
body is read the proxy asks MinerU's /health (queued_tasks, processing_tasks, max_concurrent_requests: MinerU's own
count, which includes tasks others submitted on MinerU's own port and the parses of /file_parse) and refuses with
503 + Retry-After a task that would wait behind more than `queue_size` others: queued + the submissions passing
through the proxy now + this one - MinerU's free workers > queue_size. The count is MinerU's, asked at each
submission (one loopback round trip, small beside an upload), not the health check's last answer, nor the 202's
queued_ahead (which comes after the document is stored, too late to refuse it). Submissions racing each other see
one another through `submitting`; a stale /health can let one more through, never an unbounded number. What
MinerU keeps after a parse (its results, for `dcu_mineru_task_retention` seconds) is bounded by its retention
times the parse rate, which the workers bound. A submission gets a results-log line (api `parse_task`, its orid
from X-Orid, `task_id`), a result read one (api `parse_result`), a status poll is only counted (api
`parse_status`): a caller polls many times per document.

MinerU writes status_url and result_url from the Host it saw (request.url_for: the proxy's connection to it): in its
JSON answers (the 202, a status, the result's 202 and 409) and in a zip's X-MinerU-Task-*-Url headers they are
pointed at the entrance, /mineru on the caller's own scheme and Host - or, behind a gateway (`gateway.secret`, so the
header is the gateway's), the X-MinerU-Entrance the gateway sends: where its callers reach this host's MinerU
(/mineru/<host> on the gateway; dcu_serving.gateway.config). A task's result (MinerU's JSON or a zip) is
passed on as it comes; the short answers are read whole (at most TASK_ANSWER_BYTES) to be rewritten. A task id is
MinerU's form (a lowercase UUID4) or a 400 naming it: only /tasks/{id} and /tasks/{id}/result built from a checked
id reach MinerU, never the caller's path.

Who reads a task: the id is the capability (122 random bits, as MinerU makes it); MinerU has no owner. Behind a
gateway (`gateway.secret`, so X-Caller is vouched for) the proxy also remembers who submitted each task (the last
TASK_OWNERS of them, in memory) and answers another caller's read with a 404; a task it does not know (submitted
before a restart, on MinerU's own port, or forgotten) is read with the id alone.

MinerU's own /health is asked with the backends' health checks, for /__lb_status and the metrics. Without
`mineru.url` these paths answer 404 saying how the entrance is turned on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from aiohttp import web

from .errors import ProxyError
from .relay import (
    ORID_HEADER,
    Upload,
    _body_timeout,
    _continue,
    _forwarded_headers,
    _ms,
    _response_headers,
    _unreadable,
)
from .responses import SELF, error_response, request_id
from .upstream import ConnectFailed, ConnectionBroken, DeadlineExceeded, Pool

if TYPE_CHECKING:
    from .server import Proxy

log = logging.getLogger("dcu_proxy")

PREFIX = "/mineru"
PARSE_PATH = PREFIX + "/file_parse"
HEALTH_PATH = PREFIX + "/health"
TASKS_PATH = PREFIX + "/tasks"
# Behind a gateway, where its callers reach this entrance (an absolute URL with a path, no query).
ENTRANCE_HEADER = "X-MinerU-Entrance"
ENTRANCE_URL = re.compile(r"https?://[^/\s?#]+(/[^\s?#]*)?")
MINERU_ERROR_CHARS = 300  # of MinerU's own error message in the results log
# The reason label of dcu_proxy_mineru_rejected_total, by the status of the answer the proxy made itself.
REFUSALS = {400: "no_document", 404: "off", 408: "body_timeout", 413: "too_large", 502: "unreachable",
            503: "queue_full", 504: "deadline"}
# MinerU's task ids: str(uuid.uuid4()) (fast_api.py, create_async_parse_task), nothing else reaches MinerU.
TASK_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
TASK_ID_FORM = "MinerU's task id, a lowercase UUID4 such as 0b7e2c52-5f1e-4c8a-9d3b-6a1f2e4d5c6b"
TASK_REFUSALS = {400: "bad_task_id", 404: "off", 502: "unreachable", 504: "deadline"}
TASK_OWNERS = 65536  # tasks whose submitter the proxy remembers (behind a gateway); the oldest is forgotten first
TASK_ANSWER_BYTES = 1 << 20  # the most of a task's status answer read whole (to point its URLs at the entrance)


class Slots:
    """`limit` parses in flight and `queue_size` more waiting for one, first come first served."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.limit = 1
        self.queue_size = 0
        self.active = 0  # slots held, including one handed to a waiter that has not resumed yet
        self.waiting: deque[asyncio.Future] = deque()

    def configure(self, limit: int, queue_size: int):
        """New bounds (a reload): a raised limit lets waiters in now, a lowered one takes effect as parses end."""
        self.limit, self.queue_size = limit, queue_size
        self._fill()

    async def take(self, deadline: float, busy: ProxyError) -> bool:
        """A slot, now or in turn; True if the parse waited. `busy` is raised when the queue is full."""
        if self.active < self.limit and not self.waiting:
            self.active += 1
            return False
        if len(self.waiting) >= self.queue_size:
            raise busy
        future = self.loop.create_future()
        self.waiting.append(future)
        try:
            async with asyncio.timeout_at(deadline):
                await future
        except BaseException:
            if future.done() and not future.cancelled():  # the slot came as it gave up: the next one takes it
                self.release()
            else:
                future.cancel()
                with contextlib.suppress(ValueError):
                    self.waiting.remove(future)
            raise
        return True

    def release(self):
        self.active -= 1
        self._fill()

    def _fill(self):
        while self.waiting and self.active < self.limit:
            future = self.waiting.popleft()
            if not future.done():
                self.active += 1
                future.set_result(None)


class MinerU:
    """The /mineru/ paths. Reads the proxy's current settings, relay (its results log and the headers it drops)
    and metrics, which a reload replaces or changes; `configure` follows a reload."""

    def __init__(self, proxy: Proxy, loop: asyncio.AbstractEventLoop):
        self._proxy = proxy
        self.loop = loop
        self.slots = Slots(loop)
        self.pool: Pool | None = None
        self.health: dict | None = None  # MinerU's last /health answer
        self.healthy = False
        self.health_error = "not asked yet"
        self.submitting = 0  # task submissions let through the bound whose 202 has not come back yet
        self.owners: OrderedDict[str, str | None] = OrderedDict()  # task id -> the caller that submitted it
        self.configure(proxy.settings)

    def configure(self, settings):
        url = settings.mineru_url
        where = urlsplit(url) if url else None
        if self.pool is not None and (where is None or self.pool.name != where.netloc):
            self.pool.retired = True
            self.pool.close()
            self.pool = None
        if where is not None and self.pool is None:
            self.pool = Pool(where.hostname, where.port, settings.connect_timeout)
            self.health, self.healthy, self.health_error = None, False, "not asked yet"
        self.slots.configure(settings.mineru_concurrency, settings.mineru_queue_size)

    def routes(self, guard) -> dict:
        """(method, path) -> handler for the main listener; `guard` lets only the API's callers through."""
        parse, health = guard(self.handle_parse), guard(self.handle_health)
        return {("POST", PARSE_PATH): parse, ("GET", HEALTH_PATH): health, ("HEAD", HEALTH_PATH): health,
                ("POST", TASKS_PATH): guard(self.handle_submit), ("GET", TASKS_PATH + "/*"): guard(self.handle_task)}

    def _off(self) -> ProxyError:
        return ProxyError(404, "MinerU's API is not served through this dcu-proxy (proxy.yml has no mineru.url): "
                               "call MinerU where it listens, or turn the entrance on (dcu_mineru_entrance: proxy "
                               "in the inventory).")

    # -- the parse --

    async def handle_parse(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._served(request, "parse", self._parse)

    async def _served(self, request: web.BaseRequest, api: str, work, logged: bool = True,
                      refusals: dict = REFUSALS) -> web.StreamResponse:
        """`work` answers the call; its results-log line (unless not `logged`) and its metrics are written here
        whatever happens. An error the proxy answers itself is counted by its reason (`refusals`)."""
        t0 = self.loop.time()
        rid = request_id(request)
        settings = self._proxy.settings
        rec = {"time": 0.0, "request_id": rid, "orid": request.headers.get(ORID_HEADER),
               "caller": request.headers.get("X-Caller") if settings.gateway_secret else None, "api": api,
               "model": None, "backend": None, "status": 0, "finish_reason": None, "prompt_tokens": None,
               "completion_tokens": None, "ttft_ms": None, "latency_ms": None, "queue_ms": None, "stream": False,
               "attempts": 0, "error": None}
        if api != "parse":
            rec["task_id"] = None
        response, refused = None, None
        try:
            try:
                response = await work(request, rec, rid, t0)
            except ProxyError as e:  # answered by the proxy, not by MinerU
                rec["status"], rec["error"] = e.status, e.message
                refused = getattr(e, "reason", None) or refusals.get(e.status, str(e.status))
                response = error_response(e, rid, rec["backend"] or SELF)
            except (ConnectionError, asyncio.CancelledError):
                raise
            except Exception as e:  # a bug: answer in the envelope and keep the trace in the journal
                log.exception("request %s failed", rid)
                rec["status"], rec["error"], refused = 500, f"internal proxy error: {type(e).__name__}", "error"
                response = error_response(ProxyError(500, rec["error"]), rid, rec["backend"] or SELF)
            if not response.prepared:
                await response.prepare(request)
                await response.write_eof()
            return response
        except (ConnectionError, asyncio.CancelledError) as e:  # the caller left (or SIGTERM's grace ended)
            self._proxy.relay._note_cut(rec)
            if isinstance(e, asyncio.CancelledError):
                raise
            return response or web.Response(status=499)  # nobody reads it
        finally:
            latency = self.loop.time() - t0
            rec["time"] = time.time()
            rec["latency_ms"] = _ms(latency)
            results = self._proxy.relay.results
            if results is not None and logged:
                results.write(rec)
            if api == "parse":
                self._proxy.metrics.parsed(rec["status"], latency,
                                           None if rec["queue_ms"] is None else rec["queue_ms"] / 1000, refused)
            else:
                self._proxy.metrics.task_call(api, rec["status"], refused)

    async def _parse(self, request: web.BaseRequest, rec: dict, rid: str, t0: float) -> web.StreamResponse:
        s = self._proxy.settings
        pool = self._upload_pool(request)
        deadline = t0 + s.mineru_timeout
        busy = ProxyError(503, f"MinerU is busy: {self.slots.active} documents in parse and {len(self.slots.waiting)} "
                               f"waiting (mineru.concurrency {s.mineru_concurrency}, queue_size "
                               f"{s.mineru_queue_size}). Retry later.", headers={"Retry-After": str(s.retry_after)})
        try:
            waited = await self.slots.take(deadline, busy)
        except TimeoutError:
            raise ProxyError(504, f"No parse slot freed up within the {s.mineru_timeout:g} s deadline "
                                  f"(mineru.timeout; the document waited in the proxy's queue). Retry later.") from None
        rec["queue_ms"] = _ms(self.loop.time() - t0) if waited else 0.0
        try:
            conn, upload = await self._open_upload(request, rec, rid, pool, b"/file_parse", deadline)
            try:
                await upload.pass_on(conn, deadline, s.mineru_timeout)
                return await self._answer(request, conn, pool, rec, rid)
            except ConnectionBroken as e:
                raise ProxyError(502, f"MinerU ({s.mineru_url}) failed before its answer was complete ({e}). "
                                      f"Safe to retry.") from None
            except DeadlineExceeded:
                raise ProxyError(504, f"The parse took longer than the proxy's {s.mineru_timeout:g} s deadline "
                                      f"(mineru.timeout): send fewer pages (start_page_id, end_page_id), or retry "
                                      f"later.") from None
        finally:
            self.slots.release()

    def _upload_pool(self, request: web.BaseRequest) -> Pool:
        """MinerU's pool for an upload: a 404 with the entrance off, a 413 for a declared length over MinerU's limit
        (before a byte is read)."""
        if self.pool is None:
            raise self._off()
        limit = self._proxy.settings.mineru_max_upload_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _too_large(limit)
        return self.pool

    async def _open_upload(self, request: web.BaseRequest, rec: dict, rid: str, pool: Pool, path: bytes,
                           deadline: float):
        """MinerU's `path` opened with the caller's upload, once its first bytes came (the parse's slot or the task's
        room is taken by then): the connection and the Upload still to pass on."""
        s = self._proxy.settings
        first = await self._first(request, deadline, s.mineru_timeout)
        upload = Upload(request.content, first, request.content_length, "Content-Encoding" in request.headers,
                        s.mineru_max_upload_bytes, _too_large)
        headers = _forwarded_headers(request, rid, self._proxy.relay.drop) + upload.headers
        rec["attempts"], rec["backend"] = 1, pool.name
        try:
            conn = await pool.open(pool.build_head(b"POST", path, headers, upload.length), upload.first, deadline)
        except ConnectFailed as e:
            raise ProxyError(502, f"MinerU ({s.mineru_url}) cannot be reached: {e}. Is dcu-mineru.service "
                                  f"running?") from None
        return conn, upload

    @staticmethod
    async def _first(request: web.BaseRequest, deadline: float, timeout: float) -> bytes:
        """The body's first bytes, once the parse has its slot (a caller that sent Expect: 100-continue is told to
        send it only now)."""
        await _continue(request)
        try:
            async with asyncio.timeout_at(deadline):
                first = await request.content.readany()
        except web.RequestPayloadError as e:
            raise _unreadable(e) from None
        except TimeoutError:
            raise _body_timeout(timeout) from None
        if not first:
            raise ProxyError(400, "No document: send a multipart/form-data body with the files to parse "
                                  "(curl -F files=@doc.pdf).", "files")
        return first

    async def _answer(self, request: web.BaseRequest, conn, pool: Pool, rec: dict, rid: str) -> web.StreamResponse:
        """MinerU's answer passed back as it comes (a result with its images can be large). An error answer is read
        first, for its message in the results log."""
        status = conn.status
        headers = _response_headers(conn.headers, pool, rid)
        s = self._proxy.settings
        task_id = headers.get("X-MinerU-Task-Id", "")
        if TASK_ID.fullmatch(task_id):  # a zip from /file_parse names its task's URLs in headers: the entrance's
            for header, suffix in (("X-MinerU-Task-Status-Url", ""), ("X-MinerU-Task-Result-Url", "/result")):
                if header in headers:
                    headers[header] = f"{_entrance(request, s)}/tasks/{task_id}{suffix}"
        rec["status"] = status
        if status != 200:
            try:
                body = await conn.read()
            finally:
                conn.release()
            rec["error"] = _mineru_error(body)
            body, _ = _pointed(body, _entrance(request, s))  # /file_parse's 409 and 503 carry the task's URLs
            return web.Response(body=body, status=status, headers=headers)
        response = web.StreamResponse(status=status, headers=headers)
        released = False
        try:
            await response.prepare(request)
            while (chunk := await conn.next_chunk()) is not None:
                await response.write(chunk)
            conn.release()
            released = True
            await response.write_eof()
        except (ConnectionBroken, DeadlineExceeded) as e:  # headers are out: the caller sees a cut answer
            rec["status"] = 502 if isinstance(e, ConnectionBroken) else 504
            rec["error"] = f"MinerU's answer was cut: {e or 'the deadline (mineru.timeout) passed'}"
            request.transport.abort()
        finally:
            if not released:
                conn.abort()
        return response

    # -- the task API --

    async def handle_submit(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._served(request, "parse_task", self._submit)

    async def handle_task(self, request: web.BaseRequest) -> web.StreamResponse:
        """GET /mineru/tasks/{task_id} (its status) and /mineru/tasks/{task_id}/result; a result read is recorded in
        the results log, a status poll only counted (a caller polls many times per document)."""
        task_id, slash, what = request.path[len(TASKS_PATH) + 1:].partition("/")
        result = what == "result"

        async def work(request, rec, rid, t0):
            return await self._task(request, rec, rid, t0, task_id, what if slash else None)
        return await self._served(request, "parse_result" if result else "parse_status", work, logged=result,
                                  refusals=TASK_REFUSALS)

    async def _submit(self, request: web.BaseRequest, rec: dict, rid: str, t0: float) -> web.StreamResponse:
        s = self._proxy.settings
        pool = self._upload_pool(request)
        deadline = t0 + s.mineru_timeout
        await self._room_for_a_task(pool, rid)
        self.submitting += 1  # counted from the check on, so submissions that race each other see one another
        try:
            conn, upload = await self._open_upload(request, rec, rid, pool, b"/tasks", deadline)
            try:
                await upload.pass_on(conn, deadline, s.mineru_timeout)
                status, body, headers = await self._small_answer(conn, pool, rid)
            except ConnectionBroken as e:
                raise ProxyError(502, f"MinerU ({s.mineru_url}) failed before it answered the submission ({e}); "
                                      f"the task may have been queued without its id reaching you.") from None
            except DeadlineExceeded:
                raise ProxyError(504, f"The submission took longer than the proxy's {s.mineru_timeout:g} s "
                                      f"deadline (mineru.timeout).") from None
        finally:
            self.submitting -= 1
        rec["status"] = status
        if status != 202:
            rec["error"] = _mineru_error(body)
            return web.Response(body=body, status=status, headers=headers)
        body, task_id = _pointed(body, _entrance(request, s))
        rec["task_id"] = task_id
        if task_id is not None and s.gateway_secret:
            self.owners[task_id] = rec["caller"]
            if len(self.owners) > TASK_OWNERS:
                self.owners.popitem(last=False)
        return web.Response(body=body, status=status, headers=headers)

    async def _room_for_a_task(self, pool: Pool, rid: str):
        """Refuse a task (503, Retry-After) that would wait at MinerU behind mineru.queue_size others.

        MinerU queues what /tasks accepts without a bound of its own (AsyncTaskManager: an unbounded asyncio.Queue,
        each upload saved to its output directory first, max_concurrent_requests parsed at once), so the bound is
        asked of MinerU's /health now: its pending tasks, less its free parse slots, plus the submissions on their
        way through this proxy and this one."""
        s = self._proxy.settings
        try:
            health = await self._ask_health(pool, self.loop.time() + s.health_timeout, rid)
        except (ConnectFailed, ConnectionBroken, DeadlineExceeded, ValueError) as e:
            raise ProxyError(502, f"MinerU ({s.mineru_url}) does not answer its /health ({e or 'timed out'}), "
                                  f"which the proxy asks before it accepts a task. Is dcu-mineru.service "
                                  f"running?") from None
        if not self.healthy:
            error = ProxyError(503, f"MinerU is not healthy ({self.health_error}): no task is accepted. Retry "
                                    f"later.", headers={"Retry-After": str(s.retry_after)})
            error.reason = "unhealthy"
            raise error
        counts = [health.get(key) for key in ("queued_tasks", "processing_tasks", "max_concurrent_requests")]
        if not all(isinstance(count, int) for count in counts):
            raise ProxyError(502, f"MinerU's /health does not give its task counts (queued_tasks, processing_tasks, "
                                  f"max_concurrent_requests): is it MinerU 3.x? {str(health)[:200]}")
        queued, processing, workers = counts
        waiting = queued + self.submitting + 1 - max(0, workers - processing)
        if waiting > s.mineru_queue_size:
            raise ProxyError(503, f"MinerU is busy: {queued} tasks queued and {processing} in parse (its "
                                  f"max_concurrent_requests {workers}), {self.submitting} more being submitted; "
                                  f"another would wait beyond mineru.queue_size {s.mineru_queue_size}. Retry later.",
                             headers={"Retry-After": str(s.retry_after)})

    async def _task(self, request: web.BaseRequest, rec: dict, rid: str, t0: float, task_id: str,
                    what: str | None) -> web.StreamResponse:
        s = self._proxy.settings
        pool = self.pool
        if pool is None:
            raise self._off()
        if not TASK_ID.fullmatch(task_id):
            raise ProxyError(400, f"Not a task id: {task_id[:80]!r}. /mineru/tasks/{{task_id}} and "
                                  f"/mineru/tasks/{{task_id}}/result take {TASK_ID_FORM} (the task_id of the 202 "
                                  f"that POST /mineru/tasks answered).", "task_id")
        if what not in (None, "result"):
            error = ProxyError(404, f"No such endpoint: {request.path}; a task has /mineru/tasks/{task_id} (its "
                                    f"status) and /mineru/tasks/{task_id}/result.")
            error.reason = "no_endpoint"
            raise error
        rec["task_id"] = task_id
        if s.gateway_secret and task_id in self.owners and self.owners[task_id] != rec["caller"]:
            error = ProxyError(404, "Task not found for this caller: a task submitted through this entrance is "
                                    "read by the caller (X-Caller) that submitted it.", "task_id")
            error.reason = "not_owner"
            raise error
        deadline = t0 + s.mineru_timeout
        path = f"/tasks/{task_id}{'/result' if what else ''}".encode()
        head = pool.build_head(b"GET", path, _forwarded_headers(request, rid, self._proxy.relay.drop), None)
        rec["attempts"], rec["backend"] = 1, pool.name
        try:
            conn = await pool.request(head, b"", deadline)
            if what and conn.status == 200:  # the result: MinerU's JSON or a zip, passed on as it comes
                return await self._answer(request, conn, pool, rec, rid)
            status, body, headers = await self._small_answer(conn, pool, rid)
        except ConnectFailed as e:
            raise ProxyError(502, f"MinerU ({s.mineru_url}) cannot be reached: {e}. Is dcu-mineru.service "
                                  f"running?") from None
        except ConnectionBroken as e:
            raise ProxyError(502, f"MinerU ({s.mineru_url}) failed before its answer was complete ({e}). Safe to "
                                  f"retry.") from None
        except DeadlineExceeded:
            raise ProxyError(504, f"MinerU did not answer within the proxy's {s.mineru_timeout:g} s deadline "
                                  f"(mineru.timeout). Retry later.") from None
        rec["status"] = status
        if status >= 400:
            rec["error"] = _mineru_error(body)
        if status == 404:  # expired at MinerU (its task retention), or never there
            self.owners.pop(task_id, None)
        body, _ = _pointed(body, _entrance(request, s))
        return web.Response(body=body, status=status, headers=headers)

    @staticmethod
    async def _small_answer(conn, pool: Pool, rid: str) -> tuple[int, bytes, object]:
        """A short answer (a task's status, MinerU's errors) read whole: at most TASK_ANSWER_BYTES."""
        status, headers = conn.status, _response_headers(conn.headers, pool, rid)
        released = False
        try:
            chunks, size = [], 0
            while (chunk := await conn.next_chunk()) is not None:
                size += len(chunk)
                if size > TASK_ANSWER_BYTES:
                    raise ConnectionBroken(f"its answer ({status}) was longer than {TASK_ANSWER_BYTES} bytes, where "
                                           f"a task's status is short")
                chunks.append(chunk)
            conn.release()
            released = True
        finally:
            if not released:
                conn.abort()
        return status, b"".join(chunks), headers

    # -- its health --

    async def handle_health(self, request: web.BaseRequest) -> web.Response:
        """MinerU's own /health, asked now (its client checks it before it sends a document)."""
        rid = request_id(request)
        pool = self.pool
        if pool is None:
            return error_response(self._off(), rid)
        try:
            head = pool.build_head(b"GET", b"/health", b"X-Request-Id: %s\r\n" % rid.encode(), None)
            conn = await pool.request(head, b"", self.loop.time() + self._proxy.settings.health_timeout)
            status, headers = conn.status, _response_headers(conn.headers, pool, rid)  # release() clears them
            try:
                body = await conn.read()
            finally:
                conn.release()
        except (ConnectFailed, ConnectionBroken, DeadlineExceeded) as e:
            message = f"MinerU ({self._proxy.settings.mineru_url}) does not answer its /health: {e or 'timed out'}"
            return error_response(ProxyError(503, message), rid)
        return web.Response(body=body, status=status, headers=headers)

    async def check(self, timeout: float):
        """Ask MinerU's /health for /__lb_status and the metrics (with the backends' health checks)."""
        pool = self.pool
        if pool is None:
            return
        with contextlib.suppress(ConnectFailed, ConnectionBroken, DeadlineExceeded, ValueError):
            await self._ask_health(pool, self.loop.time() + timeout)
        if not self.healthy:
            log.debug("MinerU %s is not healthy: %s", pool.name, self.health_error)

    async def _ask_health(self, pool: Pool, deadline: float, rid: str | None = None) -> dict:
        """MinerU's /health now, kept for the status and metrics; {} when it answered unhealthy. Raises what the
        connection raises (ValueError: an answer that is not JSON)."""
        head = pool.build_head(b"GET", b"/health", b"X-Request-Id: %s\r\n" % rid.encode() if rid else b"", None)
        try:
            conn = await pool.request(head, b"", deadline)
            status = conn.status
            try:
                body = await conn.read()
            finally:
                conn.release()
            answer = json.loads(body) if status == 200 else None
        except (ConnectFailed, ConnectionBroken, DeadlineExceeded, ValueError) as e:
            self.health, self.healthy = None, False
            self.health_error = str(e) or type(e).__name__
            raise
        self.health = answer if isinstance(answer, dict) else None
        self.healthy = self.health is not None and self.health.get("status") == "healthy"
        self.health_error = None if self.healthy else f"/health answered {status}: {body[:200]!r}"
        return self.health or {}

    def status(self) -> dict | None:
        """MinerU's entry in /__lb_status, None when the entrance is off."""
        if self.pool is None:
            return None
        s = self._proxy.settings
        health = self.health or {}
        return {"url": s.mineru_url, "healthy": self.healthy, "error": self.health_error,
                "in_flight": self.slots.active, "waiting": len(self.slots.waiting),
                "concurrency": s.mineru_concurrency, "queue_size": s.mineru_queue_size,
                "max_upload_bytes": s.mineru_max_upload_bytes, "timeout": s.mineru_timeout,
                "tasks": {state: health.get(f"{state}_tasks") for state in ("queued", "processing")},
                "submitting": self.submitting, "task_owners": len(self.owners)}


def _entrance(request: web.BaseRequest, settings) -> str:
    """Where the caller reaches MinerU through the proxy: /mineru on its own scheme and host, or behind a gateway
    the gateway's path to it (X-MinerU-Entrance, believed only with the gateway's secret)."""
    given = request.headers.get(ENTRANCE_HEADER) if settings.gateway_secret else None
    if given and ENTRANCE_URL.fullmatch(given):
        return given.rstrip("/")
    return f"{request.scheme}://{request.host}{PREFIX}"


def _pointed(body: bytes, entrance: str) -> tuple[bytes, str | None]:
    """MinerU's task answer with its status_url and result_url pointed at the entrance (MinerU writes them from the
    Host it saw, the proxy's connection to it), and the task id; an answer without a task id is left as it is."""
    try:
        answer = json.loads(body)
    except ValueError:
        return body, None
    task_id = answer.get("task_id") if isinstance(answer, dict) else None
    if not isinstance(task_id, str) or not TASK_ID.fullmatch(task_id):
        return body, None
    for key, suffix in (("status_url", ""), ("result_url", "/result")):
        if key in answer:
            answer[key] = f"{entrance}/tasks/{task_id}{suffix}"
    return json.dumps(answer, ensure_ascii=False).encode(), task_id


def _too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"The upload is larger than MinerU's limit of {limit >> 20} MiB (mineru.max_upload_mb; "
                           f"dcu_mineru_max_upload_mb in the inventory): split the document, or raise the limit. "
                           f"Nothing was parsed.", "files")


def _mineru_error(body: bytes) -> str:
    """MinerU's error as its answer says it (`detail`, `error` or `message`), shortened; the answer's file names and
    anything else it holds stay out of the results log."""
    try:
        answer = json.loads(body)
    except ValueError:
        return "MinerU answered without JSON"
    if isinstance(answer, dict):
        for key in ("error", "detail", "message"):
            value = answer.get(key)
            if isinstance(value, dict):
                value = value.get("message")
            if value:
                return str(value)[:MINERU_ERROR_CHARS]
    return "MinerU answered an error"
