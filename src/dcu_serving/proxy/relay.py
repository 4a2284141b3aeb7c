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
from typing import Callable

from aiohttp import web
from multidict import CIMultiDict

from . import contract, queueing, routing
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
ORID_HEADER = "X-Orid"  # the orid where the body's `user` is not read: an upload's form without it, a refused body

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
STALLED = "the client stopped reading the stream for {timeout:g} s (write_timeout): its connection was closed"


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
        self.bodies = 0  # bytes of request bodies held now (Held), against settings.body_budget
        self.writing: dict = {}  # client transport -> [record, write buffer size, since]: streams being written
        self.configure(settings)

    def configure(self, settings: Config):
        """Take (re)loaded settings; call after the balancer has its pools (routing follows them)."""
        self.settings = settings
        # The gateway's secret (its Authorization) stops here: no model server sees it.
        self.drop = _DROP_REQUEST | {b"authorization"} if settings.gateway_secret else _DROP_REQUEST
        self.passing = settings.contract.model == "pass"
        routing.configure(self.balancer.groups)
        # An API whose models all share one pool: that pool is known before the body is read (_admit).
        self._only_pool = {api: pools.pop() for api in set(APIS.values())
                           if len(pools := set(api.routes.values())) == 1}

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
                                 None if ttft is None else ttft / 1000, None if queue_ms is None else queue_ms / 1000,
                                 rec["backend"])

    async def _forward(self, request: web.BaseRequest, api: Api, rid: str, rec: dict, t0: float,
                       read: tuple | None = None, held: Held | None = None):
        """Read the JSON request, find its model's pool, check the contract (chat and completions), then take a
        slot in the pool and send it; a card that could not be reached is ejected and the request goes once
        more to another. Nothing is retried once a card may have started work.

        `read`: (call, pool, deadline, upload) of an upload read as far as routing needs (_forward_upload): it
        is only sent, its rest (`upload`, an Upload, or None when the form is whole) passed on as it arrives.
        `held`: the body's share of the body budget (a body that did not come with its head, _forward_held),
        given back as soon as a card has the request. The attempt loop below is the one for every API: one
        coroutine does it all, as this is every request's path (bench/proxy_instructions.py).
        """
        s = self.settings
        if read is not None:
            call, group, deadline, upload = read
            payload = None
        else:
            upload = None
            if request.content_type != "application/json":
                raise ProxyError(400, f"Content-Type must be application/json, got {request.content_type!r}: "
                                      f"send the request body as JSON.")
            deadline = t0 + s.request_timeout
            content = request.content
            if held is not None:
                body = await self._read_body(request, s.max_body_bytes, deadline, held)
            elif content.is_eof():  # it all came with the head, as short requests do: no waiting, one copy
                body = content.read_nowait()
                if len(body) > s.max_body_bytes:
                    raise _too_large(s.max_body_bytes)
            else:  # still arriving: read under the budget of bodies held at once
                return await self._forward_held(request, api, rid, rec, t0)
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
                call = contract.check(body, payload, s.contract)
                rec["stream"] = call.stream  # as vLLM reads it: "stream": "true" streams too
            else:  # embeddings, rerank, score: passed on as they came
                call = contract.Call(body, model, user, None, False)

        headers = _forwarded_headers(request, rid, self.drop)
        if upload is None:
            length = len(call.body)
        else:
            headers += upload.headers
            length = upload.length
        path = request.raw_path.encode()
        balancer = self.balancer
        loop = self.loop
        first_failure = None
        waited = None  # what the request says of its cost, once it had to wait in a pool queued by cost
        while True:
            try:
                front = first_failure is not None
                backend = group.take(front)
                if backend is None:
                    if group.by_cost and not front:
                        waited = queueing.estimate(payload if api.chat else None,
                                                   len(call.body) if length is None else length)
                    backend = await group.wait(deadline, front, waited)
            except DeadlineExceeded:
                raise ProxyError(504, f"No slot freed up within the {s.request_timeout:g} s deadline (the "
                                      f"request waited in the proxy's queue). Retry later.") from None
            if rec["queue_ms"] is None:
                rec["queue_ms"] = _ms(loop.time() - t0)
                if waited is not None:
                    self.metrics.queued(group.speed.seconds(waited), loop.time() - t0)
            rec["attempts"] += 1
            rec["backend"] = backend.name
            sent = False
            try:
                try:
                    if upload is None:
                        conn = await backend.pool.request(
                            backend.pool.build_head(b"POST", path, headers, length), call.body, deadline)
                    else:  # the head and what was read; the rest follows in upload.pass_on
                        conn = await backend.pool.open(
                            backend.pool.build_head(b"POST", path, headers, length), upload.first, deadline)
                except ConnectFailed as e:
                    balancer.eject(backend, str(e))
                    if first_failure is None:  # never reached the backend: once more, elsewhere
                        first_failure = str(e)
                        self.metrics.retries += 1
                        continue
                    raise ProxyError(502, f"Could not reach a backend ({first_failure}; then {e}). Both are "
                                          f"ejected; safe to retry.") from None
                sent = True  # from here the backend may have started: never sent again
                if held is not None:  # the card has what was read: it need not be held any more
                    held.release()
                    call.body = body = payload = None
                    if upload is not None:
                        upload.first = None
                if upload is not None:
                    log.debug("request %s: upload to %s goes on as it arrives (%d bytes read to find the model)",
                              rid, backend.name, upload.count)
                    await upload.pass_on(conn, deadline, s.request_timeout)
                response = await self._answer(request, conn, backend, call, rec, rid, t0)
                if waited is not None:  # what it cost, for the next estimates of this pool
                    group.speed.learn(waited, rec, loop.time() - t0)
                return response
            except ConnectionBroken as e:
                sent = True
                balancer.eject(backend, str(e))
                raise ProxyError(502, f"The backend {backend.name} failed before the answer was complete "
                                      f"({e}); it is ejected. Safe to retry.") from None
            except DeadlineExceeded:
                sent = True
                raise ProxyError(504, _too_slow(api, s.request_timeout)) from None
            finally:
                group.release(backend, served=sent)

    async def _forward_held(self, request: web.BaseRequest, api: Api, rid: str, rec: dict, t0: float):
        """A body that did not come with its head (a large one): refused before it is read when the pool it can
        only go to cannot take it, or when the bodies held at once would pass `body_budget` (503, Retry-After);
        else read, counted against the budget until a card has it."""
        held = Held(self)
        try:
            try:
                self._admit(api, request.content_length, held)
            except ProxyError:
                # Refused unread: the body's `user` is never seen, so the order is logged by its X-Orid header.
                rec["orid"] = request.headers.get(ORID_HEADER)
                raise
            return await self._forward(request, api, rid, rec, t0, held=held)
        finally:
            held.release()

    def _admit(self, api: Api, length: int | None, held: Held):
        """Refuse a body before reading it: too large (413), its only pool unable to take it (503), or, with a
        declared length, more than the body budget holds now (503)."""
        limit = self.settings.max_body_bytes
        if length is not None and length > limit:
            raise _too_large(limit)
        only = self._only_pool.get(api)
        if only is not None:
            only.admits()
        if length is not None:
            held.take(length)

    async def _forward_upload(self, request: web.BaseRequest, api: Api, rid: str, rec: dict, t0: float):
        """A multipart/form-data upload (a transcription): read until its `model` is known, then send what was
        read and pass the rest on as it arrives (_forward), so an audio file is not held whole in the proxy.

        The orid is the form's `user` field, if it comes before the file, else the X-Orid header.
        """
        held = Held(self)
        try:
            return await self._forward_form(request, api, rid, rec, t0, held)
        finally:
            held.release()

    async def _forward_form(self, request: web.BaseRequest, api: Api, rid: str, rec: dict, t0: float, held: Held):
        s = self.settings
        boundary = boundary_of(request.headers.get("Content-Type", ""))
        limit = s.max_body_bytes
        length = request.content_length
        self._admit(api, None, held)
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
                    held.take(len(chunk))  # what is read to find the model is held (a file before it: whole)
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
        # A form that ended while it was read (a short clip) is sent like any request; else the rest follows.
        upload = None if ended else Upload(content, call.body, length, "Content-Encoding" in request.headers,
                                           limit)
        return await self._forward(request, api, rid, rec, t0, (call, group, deadline, upload), held)

    async def _read_body(self, request: web.BaseRequest, limit: int, deadline: float, held: Held) -> bytes:
        """The whole body, counted against the budget as it comes when no length was declared (_admit took a
        declared one)."""
        declared = request.content_length is not None
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
                    if not declared:
                        held.take(len(chunk))
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
        transport = request.transport
        try:
            await response.prepare(request)
            self.writing[transport] = [rec, 0, 0.0]  # watched: a caller that stops reading frees the card
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
                rec["error"] = _too_slow(APIS[request.path], self.settings.request_timeout)
            try:
                await response.write(sse_error(rec["status"], rec["error"]))
                await response.write_eof()
            except ConnectionError:
                pass
        except ConnectionError:  # the caller went away while we wrote: stop the generation too
            self._note_cut(rec)
        finally:
            self.writing.pop(transport, None)
            if not released:
                conn.abort()
        return response

    async def watch_writes(self, interval: float = 1.0):
        """Close the connection of a stream's caller that has stopped reading for `write_timeout`: its write
        waits on a full buffer that does not drain, and its card slot would stay taken until TCP gives up.
        Checked every `interval` seconds on the streams being written, not on every write."""
        loop = self.loop
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            timeout = self.settings.write_timeout
            for transport, state in list(self.writing.items()):
                size = transport.get_write_buffer_size() if not transport.is_closing() else 0
                if size == 0 or size != state[1]:  # all written, or moving: not stuck
                    state[1], state[2] = size, now
                elif now - state[2] >= timeout:
                    rec = state[0]
                    rec["error"] = STALLED.format(timeout=timeout)
                    log.warning("request %s: the caller stopped reading for %g s; closing its connection",
                                rec["request_id"], timeout)
                    del self.writing[transport]
                    transport.abort()

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
            if not (rec["error"] or "").startswith(STALLED[:20]):
                rec["error"] = "the client closed the connection"


class Held:
    """One request body's share of `body_budget`, the bytes of request bodies the proxy holds at once. The first
    body is always taken (a budget below max_body_bytes still serves one at a time); past the budget a body is
    refused, 503 with Retry-After, before more of it is read."""

    __slots__ = ("bytes", "relay")

    def __init__(self, relay: Relay):
        self.relay = relay
        self.bytes = 0

    def take(self, count: int):
        relay = self.relay
        budget = relay.settings.body_budget
        if relay.bodies > self.bytes and relay.bodies + count > budget:
            raise ProxyError(503, f"Service busy: the proxy holds {relay.bodies >> 20} MiB of request bodies "
                                  f"(body_budget {budget >> 20} MiB) and does not read more now. Retry after a "
                                  f"moment.", headers={"Retry-After": str(relay.settings.retry_after)})
        relay.bodies += count
        self.bytes += count

    def release(self):
        self.relay.bodies -= self.bytes
        self.bytes = 0


class Upload:
    """The rest of an upload whose model is known: what was read (`first`) goes with the head, the rest is passed
    on as it arrives, at the pace the backend reads it (`pass_on`), never held whole."""

    __slots__ = ("chunked", "content", "count", "first", "headers", "length", "limit", "too_large")

    def __init__(self, content, prefix: bytes, length: int | None, encoded: bool, limit: int,
                 too_large: Callable[[int], ProxyError] | None = None):
        self.content = content
        self.count = len(prefix)
        self.limit = limit
        self.too_large = too_large or _too_large  # the 413 naming the limit that applies (MinerU's has its own)
        # Content-Length is the caller's unless aiohttp decoded a Content-Encoding; else the body goes chunked.
        self.chunked = length is None or encoded
        if self.chunked:
            self.headers = b"Transfer-Encoding: chunked\r\n"
            self.first = b"%x\r\n%s\r\n" % (len(prefix), prefix)
            self.length = None
        else:
            self.headers = b""
            self.first = prefix
            self.length = length

    async def pass_on(self, conn, deadline: float, timeout: float):
        """Write the rest of the caller's body to `conn`, then wait for the answer's head. The connection is
        dropped if this fails: its upload was not written to the end."""
        content, chunked, count = self.content, self.chunked, self.count
        reading = False  # waiting for the caller (a 408 if the deadline passes then), not for the backend
        conn.body_pending = True
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
                        break
                    count += len(chunk)
                    if count > self.limit:
                        raise self.too_large(self.limit)
                    conn.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                    await conn.drain()
                await conn.response()
        except web.RequestPayloadError as e:
            conn.abort()
            raise _unreadable(e) from None
        except TimeoutError:
            conn.abort()
            if reading:
                raise _body_timeout(timeout) from None
            raise DeadlineExceeded() from None
        except BaseException:
            conn.abort()
            raise


def _forwarded_headers(request: web.BaseRequest, rid: str, drop: frozenset = _DROP_REQUEST) -> bytes:
    """The caller's headers to forward, and the request id (the caller's, or the one made for it)."""
    # A list, not a generator: join() on a generator costs a resumption per header (bench/proxy_instructions.py).
    headers = b"".join([b"%s: %s\r\n" % (name, value) for name, value in request.raw_headers
                        if name.lower() not in drop])
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


def _too_slow(api: Api, timeout: float) -> str:
    """The one message for a request that passed its deadline at a card, streamed or not."""
    advice = "Lower max_tokens or turn off thinking." if api.chat else "Send less per request, or retry later."
    return f"The request took longer than the proxy's {timeout:g} s deadline (request_timeout). {advice}"


def _too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"The request body is larger than the proxy's limit of {limit} bytes (max_body_bytes): "
                           f"send smaller or fewer images, or a shorter audio file.")


def _ms(seconds: float) -> float:
    """Milliseconds to 0.1 ms, for the results log; round(x, 1) costs three times as much."""
    return int(seconds * 10000 + 0.5) / 10
