"""The API paths: one request from the caller to a card and its answer back, recorded on the way.

The request is read and checked against the contract before any card spends anything on it, waits for a
slot, is sent (once more to another card if the first could not be reached: nothing had started there), and
the answer goes back as it comes, event by event on a stream. Every request, answered or refused, ends as one
results-log line and one observation in the metrics.

This is the path every request takes; its CPU per request is measured (bench/proxy_instructions.py), so it
reads what it needs from its own attributes and calls module functions, not helpers one lookup away.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web
from multidict import CIMultiDict

from . import contract, routing
from .answers import answer_fields, scan_events
from .balancer import Backend, Balancer
from .config import Config
from .errors import ProxyError, sse_error
from .metrics import Metrics
from .responses import SELF, error_response, request_id
from .results import ResultsLog
from .routing import APIS, Api
from .uploads import FormScanner, boundary_of
from .upstream import ConnectFailed, ConnectionBroken, DeadlineExceeded

log = logging.getLogger("dcu_proxy")

API_PATHS = tuple(APIS)
ORID_HEADER = "X-Orid"  # where an upload's orid may come from, when its form has no `user` field

# Request headers not forwarded: hop-by-hop ones, those the proxy writes itself, and Content-Encoding (aiohttp
# has decoded the body).
_DROP_REQUEST = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer", b"upgrade",
    b"host", b"content-length", b"expect", b"accept-encoding", b"content-encoding", b"x-request-id",
})
# Response headers not passed back: hop-by-hop ones, and those the proxy sets.
_DROP_RESPONSE = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"x-request-id", b"x-backend",
})
_PARTIAL_EVENT_LIMIT = 1 << 20  # an SSE event larger than this is passed on unframed


class Relay:
    """Answers the API paths (routing.APIS) by way of a card of the request's model.

    `settings` and `results` are replaced on reload (Proxy.reload); `stopping` is set when SIGTERM came,
    so requests cut from then on are recorded as the proxy's doing, not the caller's.
    """

    def __init__(self, settings: Config, balancer: Balancer, metrics: Metrics, results: ResultsLog | None,
                 loop: asyncio.AbstractEventLoop):
        self.balancer = balancer
        self.metrics = metrics
        self.results = results
        self.loop = loop  # kept: get_running_loop() costs a getpid() syscall on 3.11
        self.stopping = False
        self.configure(settings)

    def configure(self, settings: Config):
        """Take (re)loaded settings; call after the balancer has its pools (routing follows them)."""
        self.settings = settings
        # The gateway's secret (its Authorization) stops here: no model server sees it.
        self.drop = _DROP_REQUEST | {b"authorization"} if settings.gateway_secret else _DROP_REQUEST
        self.passing = settings.contract.model == "pass"
        routing.configure(self.balancer.groups)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        loop = self.loop
        t0 = loop.time()
        api = APIS[request.path]  # the path the listener routed here by
        rid = request_id(request)
        # The calling system's alias, as the gateway names it; believed only from a call that proved it came from
        # the gateway (its secret: the server let nothing else through).
        caller = request.headers.get("X-Caller") if self.settings.gateway_secret else None
        rec = {"time": 0.0, "request_id": rid, "orid": None, "caller": caller, "api": api.name, "model": None,
               "backend": None, "status": 0, "finish_reason": None, "prompt_tokens": None, "completion_tokens": None,
               "ttft_ms": None, "latency_ms": None, "queue_ms": None, "stream": False, "attempts": 0,
               "error": None}
        try:
            try:
                if api.upload:
                    response = await self._forward_upload(request, api, rid, rec, t0)
                else:
                    response = await self._forward(request, api, rid, rec, t0)
            except ProxyError as e:
                rec["status"] = e.status
                rec["error"] = e.message
                response = error_response(e, rid, rec["backend"] or SELF)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug: answer in the envelope and keep the trace in the journal
                log.exception("request %s failed", rid)
                rec["status"] = 500
                rec["error"] = f"internal proxy error: {type(e).__name__}"
                response = error_response(ProxyError(500, rec["error"]), rid, rec["backend"] or SELF)
            if not response.prepared:
                # Sent here rather than by aiohttp after the handler: the record's latency then includes
                # sending, and recording it (results line, metrics) is no longer in the caller's way.
                await response.prepare(request)
                await response.write_eof()
            return response
        except ConnectionError:  # the caller left while the answer was written
            self._note_cut(rec)
            return response
        except asyncio.CancelledError:
            self._note_cut(rec)
            raise
        finally:
            latency = loop.time() - t0
            rec["time"] = time.time()
            rec["latency_ms"] = _ms(latency)
            if self.results is not None:
                self.results.write(rec)
            ttft = rec["ttft_ms"]
            queue_ms = rec["queue_ms"]
            self.metrics.observe(api.name, rec["model"], rec["status"], latency,
                                 None if ttft is None else ttft / 1000, None if queue_ms is None else queue_ms / 1000)

    async def _forward(self, request: web.BaseRequest, api: Api, rid: str, rec: dict, t0: float,
                       read: tuple | None = None):
        """Read the JSON request, find its model's pool, check the contract (chat and completions), then take a
        slot in the pool and send it; a card that could not be reached is ejected and the request goes once
        more to another. Nothing is retried once a card may have started work.

        `read`: (call, pool, deadline) of a request read already (a whole upload): it is only sent. One
        coroutine does it all, as this is every request's path (bench/proxy_instructions.py).
        """
        s = self.settings
        if read is not None:
            call, group, deadline = read
        else:
            if request.content_type != "application/json":
                raise ProxyError(400, f"Content-Type must be application/json, got {request.content_type!r}: "
                                      f"send the request body as JSON.")
            deadline = t0 + s.request_timeout
            content = request.content
            if content.is_eof():  # it all came with the head, as short requests do: no waiting, one copy
                body = content.read_nowait()
                if len(body) > s.max_body_bytes:
                    raise _too_large(s.max_body_bytes)
            else:
                body = await self._read_body(request, s.max_body_bytes, deadline)
            payload = contract.parse(body)
            user = payload.get("user")
            rec["orid"] = None if user is None else str(user)
            model = payload.get("model")
            if model.__class__ is str:
                rec["model"] = model
                group = api.routes.get(model)
            else:
                group = None
            if group is None:
                group = routing.unrouted(api, model, self.balancer.groups, self.balancer.by_model, self.passing)
            if api.chat:
                rec["stream"] = payload.get("stream") is True
                call = contract.check(body, payload, s.contract)
            else:  # embeddings, rerank, score: passed on as they came
                call = contract.Call(body, model, user, None, False)

        headers = _forwarded_headers(request, rid, self.drop)
        path = request.raw_path.encode()
        balancer = self.balancer
        loop = self.loop
        first_failure = None
        while True:
            try:
                front = first_failure is not None
                backend = group.take(front) or await group.wait(deadline, front)
            except DeadlineExceeded:
                raise ProxyError(504, f"No slot freed up within the {s.request_timeout:g} s deadline (the "
                                      f"request waited in the proxy's queue). Retry later.") from None
            if rec["queue_ms"] is None:
                rec["queue_ms"] = _ms(loop.time() - t0)
            rec["attempts"] += 1
            rec["backend"] = backend.name
            sent = False
            try:
                try:
                    conn = await backend.pool.request(
                        backend.pool.build_head(b"POST", path, headers, len(call.body)), call.body, deadline)
                except ConnectFailed as e:
                    balancer.eject(backend, str(e))
                    if first_failure is None:  # never reached the backend: once more, elsewhere
                        first_failure = str(e)
                        self.metrics.retries += 1
                        continue
                    raise ProxyError(502, f"Could not reach a backend ({first_failure}; then {e}). Both are "
                                          f"ejected; safe to retry.") from None
                sent = True
                return await self._answer(request, conn, backend, call, rec, rid, t0)
            except ConnectionBroken as e:
                sent = True
                balancer.eject(backend, str(e))
                raise ProxyError(502, f"The backend {backend.name} failed before the answer was complete "
                                      f"({e}); it is ejected. Safe to retry.") from None
            except DeadlineExceeded:
                sent = True
                raise ProxyError(504, f"The request took longer than the proxy's {s.request_timeout:g} s "
                                      f"deadline. Lower max_tokens or turn off thinking.") from None
            finally:
                group.release(backend, served=sent)

    async def _forward_upload(self, request: web.BaseRequest, api: Api, rid: str, rec: dict, t0: float):
        """A multipart/form-data upload (a transcription): read until its `model` is known, then send what was
        read and pass the rest on as it arrives, so an audio file is not held whole in the proxy.

        The orid is the form's `user` field, if it comes before the file, else the X-Orid header. A card
        that could not be reached is ejected and the request goes once more to another: nothing had left the
        proxy. Once the first bytes are sent the upload is never sent again.
        """
        s = self.settings
        boundary = boundary_of(request.headers.get("Content-Type", ""))
        limit = s.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise _too_large(limit)
        deadline = t0 + s.request_timeout
        content = request.content
        await _continue(request)
        prefix = bytearray()
        scanner = FormScanner(boundary)
        ended = False
        try:
            async with asyncio.timeout_at(deadline):
                while not scanner.done:
                    chunk = await content.readany()
                    if not chunk:
                        ended = True
                        scanner.finish()
                        break
                    prefix += chunk
                    if len(prefix) > limit:
                        raise _too_large(limit)
                    scanner.feed(prefix)
            ended = ended or content.is_eof()
        except web.RequestPayloadError as e:
            raise _unreadable(e) from None
        except TimeoutError:
            raise _body_timeout(s.request_timeout) from None
        fields = scanner.fields
        user = fields.get("user")
        if user is None:
            user = request.headers.get(ORID_HEADER)
        rec["orid"] = user
        model = fields.get("model")
        rec["model"] = model
        group = api.routes.get(model) if model is not None else None
        if group is None:
            group = routing.unrouted(api, model, self.balancer.groups, self.balancer.by_model, self.passing)
        call = contract.Call(bytes(prefix), model, user, None, False)
        if ended:  # the whole form is here (a short clip): sent like any request, retried like one
            return await self._forward(request, api, rid, rec, t0, (call, group, deadline))

        # Content-Length is the caller's unless aiohttp decoded a Content-Encoding; else the body goes chunked.
        chunked = length is None or "Content-Encoding" in request.headers
        headers = _forwarded_headers(request, rid, self.drop)
        if chunked:
            headers += b"Transfer-Encoding: chunked\r\n"
            first = b"%x\r\n%s\r\n" % (len(prefix), prefix)
        else:
            first = call.body
        path = request.raw_path.encode()
        balancer = self.balancer
        loop = self.loop
        first_failure = None
        while True:
            try:
                front = first_failure is not None
                backend = group.take(front) or await group.wait(deadline, front)
            except DeadlineExceeded:
                raise ProxyError(504, f"No slot freed up within the {s.request_timeout:g} s deadline (the "
                                      f"request waited in the proxy's queue). Retry later.") from None
            if rec["queue_ms"] is None:
                rec["queue_ms"] = _ms(loop.time() - t0)
            rec["attempts"] += 1
            rec["backend"] = backend.name
            sent = False
            try:
                pool = backend.pool
                try:
                    conn = await pool.open(pool.build_head(b"POST", path, headers, None if chunked else length),
                                           first, deadline)
                except ConnectFailed as e:
                    balancer.eject(backend, str(e))
                    if first_failure is None:  # never reached the backend: once more, elsewhere
                        first_failure = str(e)
                        self.metrics.retries += 1
                        continue
                    raise ProxyError(502, f"Could not reach a backend ({first_failure}; then {e}). Both are "
                                          f"ejected; safe to retry.") from None
                sent = True
                log.debug("request %s: upload to %s goes on as it arrives (%d bytes read to find the model)",
                          rid, backend.name, len(prefix))
                try:
                    conn.body_pending = True
                    await self._pump(content, conn, len(prefix), limit, chunked, deadline)
                    await conn.response()
                except BaseException:
                    conn.abort()
                    raise
                return await self._answer(request, conn, backend, call, rec, rid, t0)
            except ConnectionBroken as e:
                sent = True
                balancer.eject(backend, str(e))
                raise ProxyError(502, f"The backend {backend.name} failed before the answer was complete "
                                      f"({e}); it is ejected. Safe to retry.") from None
            except DeadlineExceeded:
                sent = True
                raise ProxyError(504, f"The request took longer than the proxy's {s.request_timeout:g} s "
                                      f"deadline.") from None
            finally:
                group.release(backend, served=sent)

    async def _pump(self, content, conn, count: int, limit: int, chunked: bool, deadline: float):
        """The rest of the caller's body to the backend, as it arrives, at the pace the backend reads it."""
        reading = False  # waiting for the caller (a 408 if the deadline passes then), not for the backend
        try:
            async with asyncio.timeout_at(deadline):
                while not conn.answered:  # a backend that answered early has read all it wants
                    reading = True
                    chunk = await content.readany()
                    reading = False
                    if not chunk:
                        if chunked:
                            conn.write(b"0\r\n\r\n")
                        conn.body_pending = False
                        return
                    count += len(chunk)
                    if count > limit:
                        raise _too_large(limit)
                    conn.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                    await conn.drain()
        except web.RequestPayloadError as e:
            raise _unreadable(e) from None
        except TimeoutError:
            if reading:
                raise _body_timeout(self.settings.request_timeout) from None
            raise DeadlineExceeded() from None

    async def _read_body(self, request: web.BaseRequest, limit: int, deadline: float) -> bytes:
        length = request.content_length
        if length is not None and length > limit:
            raise _too_large(limit)
        content = request.content
        try:
            if content.is_eof():
                return content.read_nowait()
            await _continue(request)
            body = bytearray()  # count as it comes: a chunked upload declares no length
            async with asyncio.timeout_at(deadline):  # a body that stops coming must not hold the proxy
                async for chunk in content.iter_any():
                    body += chunk
                    if len(body) > limit:
                        raise _too_large(limit)
            return bytes(body)
        except web.RequestPayloadError as e:  # aiohttp could not decode it (Content-Encoding, chunks)
            raise _unreadable(e) from None
        except TimeoutError:
            raise _body_timeout(self.settings.request_timeout) from None

    async def _answer(self, request, conn, backend: Backend, call, rec: dict, rid: str, t0: float):
        """The card's answer to the caller: whole, or a stream passed on event by event."""
        status = conn.status
        headers = _response_headers(conn.headers, backend, rid)
        stream = call.stream
        if stream is None:  # an API whose request does not say: the answer does (a transcription stream)
            stream = rec["stream"] = headers.get("Content-Type", "").startswith("text/event-stream")
        if not (stream and status == 200):
            try:
                body = conn.body() if conn.complete else await conn.read()
            finally:
                conn.release()
            rec["status"] = status
            rec["finish_reason"], rec["prompt_tokens"], rec["completion_tokens"], rec["error"] = \
                answer_fields(body, status)
            return web.Response(body=body, status=status, headers=headers)

        response = web.StreamResponse(status=status, headers=headers)
        loop = self.loop
        released = False
        try:
            await response.prepare(request)
            pending = b""
            while True:
                chunk = await conn.next_chunk()
                if chunk is None:
                    break
                if rec["ttft_ms"] is None:
                    rec["ttft_ms"] = _ms(loop.time() - t0)
                data = pending + chunk if pending else chunk
                end = data.rfind(b"\n\n")
                if end < 0 and len(data) < _PARTIAL_EVENT_LIMIT:
                    pending = data
                    continue
                if end < 0:
                    events, pending = data, b""
                else:
                    events, pending = data[:end + 2], data[end + 2:]
                events, fields = scan_events(events, call.strip_usage)
                if fields:
                    rec.update(fields)
                if events:
                    await response.write(events)
                    if b"data: [DONE]" in events:  # the caller has the whole answer, whenever it now leaves
                        rec["status"] = status
            if pending:
                await response.write(pending)
            conn.release()
            released = True
            rec["status"] = status
            await response.write_eof()
        except (ConnectionBroken, DeadlineExceeded) as e:
            # Headers are out: the stream ends the way vLLM ends a failed one, an error event and [DONE].
            if isinstance(e, ConnectionBroken):
                self.balancer.eject(backend, str(e))
                rec["status"] = 502
                rec["error"] = f"the backend {backend.name} failed mid-stream ({e}); it is ejected. Safe to retry."
            else:
                rec["status"] = 504
                rec["error"] = (f"The request took longer than the proxy's {self.settings.request_timeout:g} s "
                                f"deadline. Lower max_tokens or turn off thinking.")
            try:
                await response.write(sse_error(rec["status"], rec["error"]))
                await response.write_eof()
            except ConnectionError:
                pass
        except ConnectionError:  # the caller went away while we wrote: stop the generation too
            self._note_cut(rec)
        finally:
            if not released:
                conn.abort()
        return response

    def _note_cut(self, rec: dict):
        """A request cut short: by the caller (499), or by the proxy's own shutdown (503). A stream whose status
        is set was delivered to its end: its caller may close before the card's stream is over."""
        if rec["stream"] and rec["status"]:
            return
        if self.stopping:
            rec["status"] = 503
            rec["error"] = (f"dcu-proxy stopped before the answer was complete (shutdown_grace "
                            f"{self.settings.shutdown_grace:g} s over)")
        else:
            rec["status"] = 499
            rec["error"] = "the client closed the connection"


def _forwarded_headers(request: web.BaseRequest, rid: str, drop: frozenset = _DROP_REQUEST) -> bytes:
    """The caller's headers to forward, and the request id (the caller's, or the one made for it)."""
    headers = b"".join(b"%s: %s\r\n" % (name, value) for name, value in request.raw_headers
                       if name.lower() not in drop)
    return headers + b"X-Request-Id: %s\r\n" % rid.encode()


def _response_headers(raw, backend: Backend, rid: str) -> CIMultiDict:
    headers = CIMultiDict([(name.decode("latin-1"), value.decode("latin-1")) for name, value in raw
                           if name.lower() not in _DROP_RESPONSE])
    headers["X-Backend"] = backend.name
    headers["X-Request-Id"] = rid
    return headers


async def _continue(request: web.BaseRequest):
    """`Expect: 100-continue` (curl sends it with bodies over 1 MiB): say so, rather than leave the caller
    waiting a second before it sends the body. aiohttp's low-level server leaves this to the handler."""
    expect = request.headers.get("Expect")
    if expect is not None and expect.lower() == "100-continue" and request.version >= (1, 1):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")


def _unreadable(e: Exception) -> ProxyError:
    reason = getattr(e.__cause__, "message", None) or str(e)
    return ProxyError(400, f"The request body could not be read ({reason}): send it uncompressed, or encoded as "
                           f"its Content-Encoding and Transfer-Encoding headers say.")


def _body_timeout(timeout: float) -> ProxyError:
    return ProxyError(408, f"The request body did not arrive within the proxy's {timeout:g} s deadline: send it "
                           f"whole, without pauses.")


def _too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"The request body is larger than the proxy's limit of {limit} bytes (max_body_bytes): "
                           f"send smaller or fewer images, or a shorter audio file.")


def _ms(seconds: float) -> float:
    """Milliseconds to 0.1 ms, for the results log; round(x, 1) costs three times as much."""
    return int(seconds * 10000 + 0.5) / 10
