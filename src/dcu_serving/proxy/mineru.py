"""MinerU's API through the proxy's entrance (`mineru` in proxy.yml; docs/proxy.md, "MinerU").

With `mineru.url` set, the main listener relays `POST /mineru/file_parse` (MinerU's synchronous parse: a form with
the documents in, the result once parsed) and `GET /mineru/health` to MinerU's API, with what the model APIs get:

- the API's callers only (the server wraps these handlers in its gateway check; the gateway's secret stops here);
- MinerU's upload limit, `max_upload_mb`: a declared length over it is a 413 before a byte is read, a body without
  one is counted as it passes (MinerU's launcher enforces the same limit behind us);
- `concurrency` parses in flight at MinerU, `queue_size` more waiting in arrival order, a 503 with Retry-After
  beyond. A waiting parse's body is not read until it has its slot (Expect: 100-continue is answered then), so
  the queue holds no documents here; then the upload is passed on as it arrives (relay.Upload), never held whole;
- `timeout` from arrival to the answer's end, queue included (504), and 408 for a body that stops arriving;
- one results-log line (api `parse`; the orid from the X-Orid header, as a form's documents carry no `user`; the
  error MinerU gave, never a byte of the document or of its Markdown) and metrics of the queue (metrics.py).

MinerU's own /health is asked with the backends' health checks, for /__lb_status and the metrics. Without
`mineru.url` both paths answer 404 saying how the entrance is turned on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
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
MINERU_ERROR_CHARS = 300  # of MinerU's own error message in the results log
# The reason label of dcu_proxy_mineru_rejected_total, by the status of the answer the proxy made itself.
REFUSALS = {400: "no_document", 404: "off", 408: "body_timeout", 413: "too_large", 502: "unreachable",
            503: "queue_full", 504: "deadline"}


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
        return {("POST", PARSE_PATH): parse, ("GET", HEALTH_PATH): health, ("HEAD", HEALTH_PATH): health}

    def _off(self) -> ProxyError:
        return ProxyError(404, "MinerU's API is not served through this dcu-proxy (proxy.yml has no mineru.url): "
                               "call MinerU where it listens, or turn the entrance on (dcu_mineru_entrance: proxy "
                               "in the inventory).")

    # -- the parse --

    async def handle_parse(self, request: web.BaseRequest) -> web.StreamResponse:
        t0 = self.loop.time()
        rid = request_id(request)
        settings = self._proxy.settings
        rec = {"time": 0.0, "request_id": rid, "orid": request.headers.get(ORID_HEADER),
               "caller": request.headers.get("X-Caller") if settings.gateway_secret else None, "api": "parse",
               "model": None, "backend": None, "status": 0, "finish_reason": None, "prompt_tokens": None,
               "completion_tokens": None, "ttft_ms": None, "latency_ms": None, "queue_ms": None, "stream": False,
               "attempts": 0, "error": None}
        response, refused = None, None
        try:
            try:
                response = await self._parse(request, rec, rid, t0)
            except ProxyError as e:  # answered by the proxy, not by MinerU
                rec["status"], rec["error"], refused = e.status, e.message, REFUSALS.get(e.status, str(e.status))
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
            if results is not None:
                results.write(rec)
            self._proxy.metrics.parsed(rec["status"], latency,
                                       None if rec["queue_ms"] is None else rec["queue_ms"] / 1000, refused)

    async def _parse(self, request: web.BaseRequest, rec: dict, rid: str, t0: float) -> web.StreamResponse:
        s = self._proxy.settings
        pool = self.pool
        if pool is None:
            raise self._off()
        limit = s.mineru_max_upload_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise _too_large(limit)
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
            first = await self._first(request, deadline, s.mineru_timeout)
            upload = Upload(request.content, first, length, "Content-Encoding" in request.headers, limit, _too_large)
            headers = _forwarded_headers(request, rid, self._proxy.relay.drop) + upload.headers
            rec["attempts"], rec["backend"] = 1, pool.name
            try:
                conn = await pool.open(pool.build_head(b"POST", b"/file_parse", headers, upload.length), upload.first,
                                       deadline)
            except ConnectFailed as e:
                raise ProxyError(502, f"MinerU ({s.mineru_url}) cannot be reached: {e}. Is dcu-mineru.service "
                                      f"running?") from None
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
        rec["status"] = status
        if status != 200:
            try:
                body = await conn.read()
            finally:
                conn.release()
            rec["error"] = _mineru_error(body)
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
        try:
            conn = await pool.request(pool.build_head(b"GET", b"/health", b"", None), b"", self.loop.time() + timeout)
            status = conn.status
            try:
                body = await conn.read()
            finally:
                conn.release()
            answer = json.loads(body) if status == 200 else None
            self.health = answer if isinstance(answer, dict) else None
            self.healthy = self.health is not None and self.health.get("status") == "healthy"
            self.health_error = None if self.healthy else f"/health answered {status}: {body[:200]!r}"
        except (ConnectFailed, ConnectionBroken, DeadlineExceeded, ValueError) as e:
            self.health, self.healthy = None, False
            self.health_error = str(e) or type(e).__name__
        if not self.healthy:
            log.debug("MinerU %s is not healthy: %s", pool.name, self.health_error)

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
                "tasks": {state: health.get(f"{state}_tasks") for state in ("queued", "processing")}}


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
