"""The proxy: aiohttp handlers, the relay to the backends, lifecycle and signals."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import time
from typing import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import contract, fastjson
from .balancer import Backend, Balancer, no_backend
from .config import Config, ConfigError
from .errors import ProxyError, envelope_bytes, sse_error
from .metrics import Metrics
from .results import ResultsLog
from .upstream import ConnectFailed, ConnectionBroken, DeadlineExceeded

log = logging.getLogger("dcu_proxy")

API_PATHS = ("/v1/chat/completions", "/v1/completions")
SELF = "dcu-proxy"  # the X-Backend value of responses the proxy makes itself

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
_MAX_REQUEST_ID = 128
_PARTIAL_EVENT_LIMIT = 1 << 20  # an SSE event larger than this is passed on unframed


def _has_value(block: bytes, key: bytes) -> bool:
    """True if `key` (e.g. b'"usage":') occurs in the JSON text with a value other than null."""
    i = block.find(key)
    while i >= 0:
        j = i + len(key)
        while block[j:j + 1] == b" ":
            j += 1
        if block[j:j + 1] != b"n":
            return True
        i = block.find(key, j)
    return False


class Proxy:
    def __init__(self, config: Config, reload_config: Callable[[], Config] | None = None):
        self.settings = config
        self.models = frozenset(config.models)
        self._reload_config = reload_config
        self.balancer: Balancer | None = None
        self.results: ResultsLog | None = None
        self.metrics = Metrics(self)
        self._health_task = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._checks: set = set()  # health checks of backends added by a reload
        self.stopping = False  # SIGTERM came: requests cut now are the proxy's doing, not the caller's
        self._started = time.time()

    # -- lifecycle --

    async def start(self):
        s = self.settings
        self.loop = asyncio.get_running_loop()  # kept: get_running_loop() costs a getpid() syscall on 3.11
        if s.results_log:
            try:
                self.results = ResultsLog(s.results_log)
            except OSError as e:
                raise ConfigError("results_log", f"cannot open {s.results_log}: {e.strerror}") from e
        self.balancer = Balancer(s.backends, s.backend_concurrency, s.queue_size, s.connect_timeout,
                                 s.retry_after)
        await self.balancer.check_all(s.health_path, s.health_timeout)
        self._health_task = asyncio.ensure_future(self._health_loop())
        log.info("backends: %d/%d healthy", self.balancer.healthy_count, len(self.balancer.backends))

    async def _health_loop(self):
        """Check every backend every health.interval seconds, at a fixed rate."""
        loop = asyncio.get_running_loop()
        next_round = loop.time()
        while True:
            next_round = max(next_round + self.settings.health_interval, loop.time())
            await asyncio.sleep(next_round - loop.time())
            s = self.settings
            try:
                await self.balancer.check_all(s.health_path, s.health_timeout)
            except Exception:  # a bug must not stop the health checks for good
                log.exception("health check round failed")

    async def close(self):
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if self.balancer is not None:
            self.balancer.close()
        if self.results is not None:
            self.results.close()

    def reload(self):
        """SIGHUP: re-read the configuration and apply it; in-flight requests are not touched."""
        if self.results is not None:
            self.results.reopen()
        if self._reload_config is None:
            return
        try:
            new = self._reload_config()
        except ConfigError as e:
            log.error("reload failed, keeping the running configuration: %s", e)
            return
        old = self.settings
        for key in ("listen", "admin_listen", "admin_token", "shutdown_grace"):
            if getattr(new, key) != getattr(old, key):
                log.warning("reload: %s changed; it takes effect only after a restart", key.replace("_", "."))
        if new.results_log != old.results_log:
            if self.results is not None and new.results_log:
                self.results.reopen(new.results_log)
            elif new.results_log:
                try:
                    self.results = ResultsLog(new.results_log)
                except OSError as e:
                    log.error("reload: cannot open results_log %s: %s", new.results_log, e.strerror)
            else:
                self.results, closing = None, self.results
                closing.close()
        logging.getLogger().setLevel(new.log_level.upper())
        self.settings = new
        self.models = frozenset(new.models)
        added = self.balancer.update(new.backends, new.backend_concurrency, new.queue_size,
                                     new.connect_timeout, new.retry_after)
        for b in added:
            task = asyncio.ensure_future(self.balancer.check(b, new.health_path, new.health_timeout))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)
        log.info("reloaded %s: %d backends, cap %d, queue %d", new.source or "configuration",
                 len(new.backends), new.backend_concurrency, new.queue_size)

    # -- the API: contract, routing, relay --

    async def handle_api(self, request: web.BaseRequest) -> web.StreamResponse:
        loop = self.loop
        t0 = loop.time()
        rid = request_id(request)
        rec = {"time": 0.0, "request_id": rid, "orid": None, "model": None, "backend": None, "status": 0,
               "finish_reason": None, "prompt_tokens": None, "completion_tokens": None, "ttft_ms": None,
               "latency_ms": None, "queue_ms": None, "stream": False, "attempts": 0, "error": None}
        try:
            try:
                response = await self._proxy(request, rid, rec, t0)
            except ProxyError as e:
                rec["status"] = e.status
                rec["error"] = e.message
                response = self.error_response(e, rid, rec["backend"] or SELF)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug: answer in the envelope and keep the trace in the journal
                log.exception("request %s failed", rid)
                rec["status"] = 500
                rec["error"] = f"internal proxy error: {type(e).__name__}"
                response = self.error_response(ProxyError(500, rec["error"]), rid, rec["backend"] or SELF)
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
            self.metrics.observe(rec["status"], latency, None if ttft is None else ttft / 1000,
                                 None if queue_ms is None else queue_ms / 1000)

    async def _proxy(self, request: web.BaseRequest, rid: str, rec: dict, t0: float):
        s = self.settings
        if request.content_type != "application/json":
            raise ProxyError(400, f"Content-Type must be application/json, got {request.content_type!r}: "
                                  f"send the request body as JSON.")
        deadline = t0 + s.request_timeout
        body = await self._read_body(request, s.max_body_bytes, deadline)
        payload = contract.parse(body)
        user = payload.get("user")
        rec["orid"] = None if user is None else str(user)
        model = payload.get("model")
        rec["model"] = model if isinstance(model, str) else None
        rec["stream"] = payload.get("stream") is True
        call = contract.check(body, payload, s.contract, self.models)

        headers = b"".join(b"%s: %s\r\n" % (name, value) for name, value in request.raw_headers
                           if name.lower() not in _DROP_REQUEST)
        headers += b"X-Request-Id: %s\r\n" % rid.encode()  # the caller's, or the one made for it
        path = request.raw_path.encode()
        balancer = self.balancer
        loop = self.loop
        first_failure = None
        while True:
            try:
                front = first_failure is not None
                backend = balancer.take(front) or await balancer.wait(deadline, front)
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
                return await self._relay(request, conn, backend, call, rec, rid, t0)
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
                balancer.release(backend, served=sent)

    async def _read_body(self, request: web.BaseRequest, limit: int, deadline: float) -> bytes:
        length = request.content_length
        if length is not None and length > limit:
            raise _too_large(limit)
        content = request.content
        try:
            if content.is_eof():  # it all came with the head, as short requests do: no waiting, one copy
                return content.read_nowait()
            body = bytearray()  # count as it comes: a chunked upload declares no length
            async with asyncio.timeout_at(deadline):  # a body that stops coming must not hold the proxy
                async for chunk in content.iter_any():
                    body += chunk
                    if len(body) > limit:
                        raise _too_large(limit)
            return bytes(body)
        except web.RequestPayloadError as e:  # aiohttp could not decode it (Content-Encoding, chunks)
            reason = getattr(e.__cause__, "message", None) or str(e)
            raise ProxyError(400, f"The request body could not be read ({reason}): send it uncompressed, or "
                                  f"encoded as its Content-Encoding and Transfer-Encoding headers say.") from None
        except TimeoutError:
            raise ProxyError(408, f"The request body did not arrive within the proxy's "
                                  f"{self.settings.request_timeout:g} s deadline: send it whole, without "
                                  f"pauses.") from None

    def _response_headers(self, raw, backend: Backend, rid: str) -> CIMultiDict:
        headers = CIMultiDict([(name.decode("latin-1"), value.decode("latin-1")) for name, value in raw
                               if name.lower() not in _DROP_RESPONSE])
        headers["X-Backend"] = backend.name
        headers["X-Request-Id"] = rid
        return headers

    async def _relay(self, request, conn, backend: Backend, call, rec: dict, rid: str, t0: float):
        status = conn.status
        headers = self._response_headers(conn.headers, backend, rid)
        if not (call.stream and status == 200):
            try:
                body = conn.body() if conn.complete else await conn.read()
            finally:
                conn.release()
            rec["status"] = status
            _note_answer(body, status, rec)
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
                events = _scan_events(events, call.strip_usage, rec)
                if events:
                    await response.write(events)
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
        if self.stopping:
            rec["status"] = 503
            rec["error"] = (f"dcu-proxy stopped before the answer was complete (shutdown_grace "
                            f"{self.settings.shutdown_grace:g} s over)")
        else:
            rec["status"] = 499
            rec["error"] = "the client closed the connection"

    def error_response(self, e: ProxyError, rid: str, backend_name: str = SELF) -> web.Response:
        headers = {"Content-Type": "application/json", "X-Backend": backend_name, "X-Request-Id": rid}
        if e.headers:
            headers.update(e.headers)
        return web.Response(body=envelope_bytes(e.status, e.message, e.param), status=e.status, headers=headers)

    # -- the proxy's own endpoints --

    def _own_headers(self, request) -> dict:
        return {"X-Backend": SELF, "X-Request-Id": request_id(request)}

    async def handle_health(self, request):
        routable = sum(1 for b in self.balancer.backends if b.healthy and not b.draining)
        if routable:
            return web.Response(status=200, headers=self._own_headers(request))
        return self.error_response(no_backend(self.settings.retry_after),
                                   self._own_headers(request)["X-Request-Id"])

    async def handle_models(self, request):
        cards = []
        for name in self.settings.models:
            card = {"id": name, "object": "model", "created": int(self._started), "owned_by": "dcu-serving",
                    "root": name, "parent": None}
            if self.settings.max_model_len:
                card["max_model_len"] = self.settings.max_model_len
            cards.append(card)
        return web.json_response({"object": "list", "data": cards}, headers=self._own_headers(request))

    async def handle_lb_status(self, request):
        backends = self.balancer.backends
        return web.json_response(
            {"healthy": sum(1 for b in backends if b.healthy), "total": len(backends),
             "queue": self.balancer.queued, "backends": [b.status() for b in backends]},
            headers=self._own_headers(request))

    async def handle_metrics(self, request):
        headers = self._own_headers(request)
        headers["Content-Type"] = CONTENT_TYPE_LATEST
        return web.Response(body=generate_latest(self.metrics.registry), headers=headers)

    async def handle_not_found(self, request, allowed: tuple, known: str):
        what = "method not allowed on" if allowed else "no such endpoint:"
        message = f"{what} {request.method} {request.path}; this listener serves {known}."
        error = ProxyError(405, message, headers={"Allow": ", ".join(allowed)}) if allowed else ProxyError(404, message)
        return self.error_response(error, self._own_headers(request)["X-Request-Id"])

    # -- admin: drain and undrain --

    def _authorised(self, request) -> bool:
        token = self.settings.admin_token
        return token is None or request.headers.get("Authorization") == f"Bearer {token}"

    def _admin_view(self, b: Backend) -> dict:
        return {**b.status(), "draining": b.draining}

    async def handle_admin_backends(self, request):
        if not self._authorised(request):
            return self._unauthorised(request)
        return web.json_response({"backends": [self._admin_view(b) for b in self.balancer.backends]},
                                 headers=self._own_headers(request))

    async def handle_admin_drain(self, request):
        if not self._authorised(request):
            return self._unauthorised(request)
        rid = self._own_headers(request)["X-Request-Id"]
        try:
            ref = (await request.json())["backend"]
            if not isinstance(ref, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return self.error_response(ProxyError(400, "Send a JSON body {\"backend\": \"http://HOST:PORT\"} "
                                                       "(the URL or host:port of a backend).", "backend"), rid)
        backend = self.balancer.find(ref)
        if backend is None:
            known = ", ".join(b.url for b in self.balancer.backends)
            return self.error_response(ProxyError(404, f"No backend {ref!r}; known backends: {known}.",
                                                  "backend"), rid)
        self.balancer.set_draining(backend, request.path.endswith("/drain"))
        return web.json_response(self._admin_view(backend), headers=self._own_headers(request))

    def _unauthorised(self, request):
        response = self.error_response(ProxyError(401, "The admin API needs 'Authorization: Bearer <token>' "
                                                       "with the admin.token from the proxy's configuration."),
                                       self._own_headers(request)["X-Request-Id"])
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    # -- the listeners --
    # aiohttp's low-level server with a dict for routing: the Application's router, middleware chain and
    # per-request get_event_loop() (a getpid() system call on Python 3.11) cost more than a lookup does.

    def admin_routes(self) -> dict:
        return {("GET", "/__admin/backends"): self.handle_admin_backends,
                ("POST", "/__admin/drain"): self.handle_admin_drain,
                ("POST", "/__admin/undrain"): self.handle_admin_drain}

    def routes(self) -> dict:
        """(method, path) -> handler, for the main listener."""
        table = {("POST", path): self.handle_api for path in API_PATHS}
        table.update(_readable({"/v1/models": self.handle_models, "/health": self.handle_health,
                                "/__lb_status": self.handle_lb_status, "/metrics": self.handle_metrics}))
        if self.settings.admin_token:  # with a token the admin API is reachable on the main listener too
            table.update(self.admin_routes())
        return table

    def admin_server_routes(self) -> dict:
        return {**self.admin_routes(), **_readable({"/__lb_status": self.handle_lb_status})}

    def make_server(self, table: dict) -> web.Server:
        methods: dict[str, tuple] = {}
        for method, path in table:
            methods[path] = (*methods.get(path, ()), method)
        known = ", ".join(f"{method} {path}" for method, path in table if method != "HEAD")

        def dispatch(request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
            # A plain function returning the handler's coroutine: one coroutine less on every request.
            handler = table.get((request.method, request.path))
            if handler is None:
                return self.handle_not_found(request, methods.get(request.path, ()), known)
            return handler(request)

        def request_factory(message, payload, protocol, writer, task) -> web.BaseRequest:
            # Bodies are limited by _read_body (max_body_bytes can change on reload); this is only a backstop.
            return web.BaseRequest(message, payload, protocol, writer, task, self.loop, client_max_size=1 << 40)

        return web.Server(dispatch, request_factory=request_factory, handler_cancellation=True, access_log=None)


def _readable(handlers: dict) -> dict:
    """GET and HEAD routes for each path -> handler."""
    return {(method, path): handler for path, handler in handlers.items() for method in ("GET", "HEAD")}


def _too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"The request body is larger than the proxy's limit of {limit} bytes: send smaller "
                           f"or fewer images.")


_REQUEST_ID_PREFIX = os.urandom(8).hex()  # per process, so ids stay unique across restarts and proxies
_request_numbers = itertools.count()


def request_id(request: web.BaseRequest) -> str:
    """The caller's X-Request-Id if it is usable (printable ASCII, at most 128 characters), else a new one."""
    rid = request.headers.get("X-Request-Id")
    if not rid or len(rid) > _MAX_REQUEST_ID or not (rid.isascii() and rid.isprintable()):
        return new_request_id()
    return rid


def new_request_id() -> str:
    """32 hex digits, like uuid4().hex, without a getrandom() syscall per request."""
    return f"{_REQUEST_ID_PREFIX}{next(_request_numbers):016x}"


def _ms(seconds: float) -> float:
    """Milliseconds to 0.1 ms, for the results log; round(x, 1) costs three times as much."""
    return int(seconds * 10000 + 0.5) / 10


def _note_answer(body: bytes, status: int, rec: dict):
    """finish_reason and token counts of a whole answer, or the error message of a failed one."""
    try:
        answer = fastjson.loads(body)
    except ValueError:
        if status != 200:
            rec["error"] = body[:300].decode("utf-8", "replace")
        return
    if not isinstance(answer, dict):
        return
    if status == 200:
        choices = answer.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            rec["finish_reason"] = choices[0].get("finish_reason")
        _note_usage(answer.get("usage"), rec)
    else:
        rec["error"] = _error_message(answer)


def _error_message(answer: dict):
    error = answer.get("error")
    if isinstance(error, dict):
        return error.get("message")
    return answer.get("message") or (error if isinstance(error, str) else None)


def _note_usage(usage, rec: dict):
    if isinstance(usage, dict):
        rec["prompt_tokens"] = usage.get("prompt_tokens")
        rec["completion_tokens"] = usage.get("completion_tokens")


def _scan_events(block: bytes, strip_usage: bool, rec: dict) -> bytes:
    """Note finish_reason, usage and errors from complete SSE events; drop the usage event if the caller
    did not ask for it. Most chunks carry none of these and pass through untouched."""
    if not (_has_value(block, b'"finish_reason":') or _has_value(block, b'"usage":') or b'"error"' in block):
        return block
    kept = []
    for event in block.split(b"\n\n"):
        if not event:
            continue
        start = event.find(b"{")
        if start >= 0 and (b'"finish_reason"' in event or b'"usage"' in event or b'"error"' in event):
            try:
                obj = fastjson.loads(event[start:])
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                choices = obj.get("choices")
                if isinstance(choices, list):
                    for choice in choices:
                        if isinstance(choice, dict) and choice.get("finish_reason"):
                            rec["finish_reason"] = choice["finish_reason"]
                usage = obj.get("usage")
                _note_usage(usage, rec)
                if "error" in obj and isinstance(obj["error"], (dict, str)):
                    rec["error"] = _error_message(obj)
                if strip_usage and usage and choices == []:
                    continue
        kept.append(event)
        kept.append(b"\n\n")
    return b"".join(kept)


# -- running it --

def _client_http_error(record: logging.LogRecord) -> bool:
    """aiohttp logs a client's malformed HTTP (an oversized header, a duplicate Content-Type, a body that is not
    the gzip it claims) as an ERROR with a traceback, after answering it with a 400. That is the caller's
    mistake, not the proxy's: one WARNING line, so the journal's errors stay the proxy's own."""
    exc = record.exc_info[1] if record.exc_info else None
    while exc is not None and not (isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500):
        exc = exc.__cause__  # a body aiohttp could not decode arrives wrapped in a RequestPayloadError
    if exc is not None:
        remote = f" from {record.args[0]}" if isinstance(record.args, tuple) and record.args else ""
        reason = " ".join(str(exc.message).split())[:160]
        record.msg = f"malformed HTTP request{remote}, answered {exc.code}: {type(exc).__name__}: %s"
        record.args = (reason,)
        record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        record.exc_info = record.exc_text = None
        return logging.getLogger(record.name).isEnabledFor(logging.WARNING)  # it passed as an ERROR
    return True


async def serve(config: Config, reload_config: Callable[[], Config] | None = None,
                ready: Callable[[], None] | None = None):
    """Run until SIGTERM/SIGINT; SIGHUP reloads. Returns after a graceful drain."""
    logging.getLogger("aiohttp.server").addFilter(_client_http_error)
    proxy = Proxy(config, reload_config)
    await proxy.start()
    loop = asyncio.get_running_loop()
    runners = []
    try:
        runner = web.ServerRunner(proxy.make_server(proxy.routes()), shutdown_timeout=config.shutdown_grace)
        await runner.setup()
        runners.append(runner)
        host, port = config.listen_addr
        await web.TCPSite(runner, host, port, backlog=2048).start()
        if config.admin_addr:
            admin = web.ServerRunner(proxy.make_server(proxy.admin_server_routes()), shutdown_timeout=5)
            await admin.setup()
            runners.append(admin)
            await web.TCPSite(admin, *config.admin_addr).start()
        log.info("dcu-proxy listening on %s (admin %s), %d backends", config.listen,
                 config.admin_listen or "off", len(config.backends))
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGHUP, proxy.reload)
        if ready is not None:
            ready()
        await stop.wait()
        proxy.stopping = True
        in_flight = sum(b.active for b in proxy.balancer.backends) + proxy.balancer.queued
        log.info("stopping: no new connections; %d requests in flight get up to %g s", in_flight,
                 config.shutdown_grace)
    finally:
        for runner in reversed(runners):
            await runner.cleanup()  # stops listening, then waits up to shutdown_grace for requests
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await proxy.close()
    log.info("stopped")
