"""The running proxy: its parts wired together, its listeners, its lifecycle.

`serve()` starts the proxy, listens on the main and admin addresses, reloads on SIGHUP and drains on
SIGTERM. `Proxy` owns what lives across requests and reloads (the settings, the balancer and its health
checks, the metrics) and routes each request to its part: the API paths to the relay (relay.py), the
proxy's own endpoints (status.py) and the admin API (admin.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import signal
import time
from typing import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .admin import AdminAPI
from .balancer import Balancer
from .config import Config, ConfigError, tls_context
from .errors import ProxyError
from .metrics import Metrics
from .mineru import MinerU
from .relay import API_PATHS, Relay
from .responses import error_response, own_headers
from .results import ResultsLog
from .status import StatusEndpoints

log = logging.getLogger("dcu_proxy")


class Proxy:
    """One running proxy: the state that outlives a request, and the routing tables of its listeners."""

    def __init__(self, config: Config, reload_config: Callable[[], Config] | None = None):
        self.settings = config
        self._reload_config = reload_config
        self.balancer: Balancer | None = None
        self.relay: Relay | None = None
        self.mineru: MinerU | None = None  # MinerU's API under /mineru/ (mineru.url), off without it
        self.metrics = Metrics(self)
        self.status = StatusEndpoints(self, started=time.time())
        self.admin = AdminAPI(self)
        self._health_task = None
        self._writes_task = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._checks: set = set()  # health checks of backends added by a reload
        self._callers: dict = {}  # peer address -> may it call the API (gateway.allow), cleared on reload
        self._unproven: dict = {}  # peers refused for want of the gateway's secret (logged once each)
        self.tls = tls_context(config)  # the TLS listener's context; a reload loads a renewed certificate into it

    # -- lifecycle --

    async def start(self):
        s = self.settings
        self.loop = asyncio.get_running_loop()  # kept: get_running_loop() costs a getpid() syscall on 3.11
        results = None
        if s.results_log:
            try:
                results = ResultsLog(s.results_log)
            except OSError as e:
                raise ConfigError("results_log", f"cannot open {s.results_log}: {e.strerror}") from e
        self.balancer = Balancer(s.specs, s.backend_concurrency, s.queue_size, s.connect_timeout,
                                 s.retry_after, s.queue_policy, s.queue_aging, s.queue_reserve)
        self.relay = Relay(s, self.balancer, self.metrics, results, self.loop)
        self.mineru = MinerU(self, self.loop)
        await self.balancer.check_all(s.health_path, s.health_timeout)
        await self.mineru.check(s.health_timeout)
        self._health_task = asyncio.ensure_future(self._health_loop())
        self._writes_task = asyncio.ensure_future(self.relay.watch_writes())
        log.info("backends: %d/%d healthy", self.balancer.healthy_count, len(self.balancer.backends))
        if len(self.balancer.groups) > 1:
            for g in self.balancer.groups:
                log.info("pool %s (%s): %d/%d healthy", ", ".join(g.models), g.kind,
                         sum(1 for b in g.backends if b.healthy), len(g.backends))

    async def _health_loop(self):
        """Check every backend every health.interval seconds, at a fixed rate."""
        loop = asyncio.get_running_loop()
        next_round = loop.time()
        while True:
            next_round = max(next_round + self.settings.health_interval, loop.time())
            await asyncio.sleep(next_round - loop.time())
            s = self.settings
            try:
                await asyncio.gather(self.balancer.check_all(s.health_path, s.health_timeout),
                                     self.mineru.check(s.health_timeout))
            except Exception:  # a bug must not stop the health checks for good
                log.exception("health check round failed")

    async def close(self):
        for task in (self._health_task, self._writes_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.balancer is not None:
            self.balancer.close()
        if self.mineru is not None and self.mineru.pool is not None:
            self.mineru.pool.close()
        if self.relay is not None and self.relay.results is not None:
            self.relay.results.close()

    def reload(self):
        """SIGHUP: re-read the configuration and apply it; in-flight requests are not touched."""
        relay = self.relay
        if relay.results is not None:
            relay.results.reopen()
        if self._reload_config is None:
            return
        try:
            new = self._reload_config()
        except ConfigError as e:
            log.error("reload failed, keeping the running configuration: %s", e)
            return
        old = self.settings
        for key in ("listen", "admin_listen", "admin_token", "shutdown_grace", "idle_timeout", "tls_listen"):
            if getattr(new, key) != getattr(old, key):
                log.warning("reload: %s changed; it takes effect only after a restart", key.replace("_", "."))
        if new.results_log != old.results_log:
            if relay.results is not None and new.results_log:
                relay.results.reopen(new.results_log)
            elif new.results_log:
                try:
                    relay.results = ResultsLog(new.results_log)
                except OSError as e:
                    log.error("reload: cannot open results_log %s: %s", new.results_log, e.strerror)
            else:
                relay.results, closing = None, relay.results
                closing.close()
        if self.tls is not None and new.tls_cert:
            self._reload_certificate(new)
        logging.getLogger().setLevel(new.log_level.upper())
        self.settings = new
        self._callers, self._unproven = {}, {}
        added = self.balancer.update(new.specs, new.backend_concurrency, new.queue_size,
                                     new.connect_timeout, new.retry_after, new.queue_policy, new.queue_aging,
                                     new.queue_reserve)
        relay.configure(new)  # routing follows the balancer's new pools
        self.mineru.configure(new)
        for b in added:
            task = asyncio.ensure_future(self.balancer.check(b, new.health_path, new.health_timeout))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)
        log.info("reloaded %s: %d backends in %d pools, cap %d, queue %d", new.source or "configuration",
                 len(new.backends), len(self.balancer.groups), new.backend_concurrency, new.queue_size)

    def _reload_certificate(self, new: Config):
        """A renewed certificate for the connections that follow, checked first in a context of its own: a pair
        that does not load leaves the running one serving."""
        try:
            tls_context(new)
        except ConfigError as e:
            log.error("reload: keeping the running TLS certificate: %s", e)
            return
        self.tls.load_cert_chain(new.tls_cert, new.tls_key)

    # -- the listeners --
    # aiohttp's low-level server with a dict for routing: the Application's router, middleware chain and
    # per-request get_event_loop() (a getpid() system call on Python 3.11) cost more than a lookup does.

    def routes(self) -> dict:
        """(method, path) -> handler, for the main listener."""
        api = self._gateway_only(self.relay.handle)
        table = {("POST", path): api for path in API_PATHS}
        status = self.status
        table.update(_readable({"/v1/models": self._gateway_only(status.handle_models),
                                "/health": status.handle_health, "/__lb_status": status.handle_lb_status,
                                "/metrics": status.handle_metrics}))
        table.update(self.mineru.routes(self._gateway_only))  # answering 404 while mineru.url is unset
        if self.settings.admin_token:  # with a token the admin API is reachable on the main listener too
            table.update(self.admin.routes())
        return table

    def _gateway_only(self, handler):
        """The API for the callers `gateway.allow` names, carrying `gateway.secret` when one is set; the others are
        told where the gateway is. Read from the settings at each request, so a reload applies it; a peer's
        address verdict is remembered until then, the secret is compared at every call (in constant time)."""

        def guarded(request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
            settings = self.settings
            if not settings.gateway_allow:
                return handler(request)
            peer = request.remote
            trusted = self._callers.get(peer)
            if trusted is None:
                if len(self._callers) >= 4096:  # a scan from many addresses must not grow it without end
                    self._callers.clear()
                trusted = self._callers[peer] = _within(peer, settings.gateway_allow)
                if not trusted:
                    log.warning("refusing API calls from %s: only the gateway %s may call (gateway.allow)",
                                peer, settings.gateway_url)
            if trusted and (settings.gateway_secret is None or _proves(request, settings.gateway_secret)):
                return handler(request)
            if trusted and self._unproven.get(peer) is None:
                if len(self._unproven) >= 4096:
                    self._unproven.clear()
                self._unproven[peer] = True
                log.warning("refusing API calls from %s without the gateway's secret (gateway.secret)", peer)
            return _forbidden(request, settings.gateway_url)
        return guarded

    def admin_server_routes(self) -> dict:
        """(method, path) -> handler, for the admin listener."""
        return {**self.admin.routes(), **_readable({"/__lb_status": self.status.handle_lb_status})}

    def make_server(self, table: dict) -> web.Server:
        """A server routing by `table`; a path ending in `*` there is a prefix (MinerU's /mineru/tasks/{id}), tried
        only when no exact path matches."""
        methods: dict[str, tuple] = {}
        for method, path in table:
            methods[path] = (*methods.get(path, ()), method)
        known = ", ".join(f"{method} {path}" for method, path in table if method != "HEAD")
        prefixes = tuple((method, path[:-1], handler) for (method, path), handler in table.items()
                         if path.endswith("*"))

        def dispatch(request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
            # A plain function returning the handler's coroutine: one coroutine less on every request.
            handler = table.get((request.method, request.path))
            if handler is None:
                path = request.path
                allowed = methods.get(path, ())
                for method, prefix, under in prefixes:
                    if path.startswith(prefix):
                        if method == request.method:
                            return under(request)
                        allowed = (*allowed, method)
                return _not_found(request, allowed, known)
            return handler(request)

        def request_factory(message, payload, protocol, writer, task) -> web.BaseRequest:
            # Bodies are limited by the relay (max_body_bytes can change on reload); this is only a backstop.
            return web.BaseRequest(message, payload, protocol, writer, task, self.loop, client_max_size=1 << 40)

        # keepalive_timeout counts from the connection's start or its last answer, and closes it if no request has
        # arrived whole by then: the idle keep-alive and the deadline for a request's headers in one (nginx: 75
        # and 60 s). aiohttp's default is an hour.
        return web.Server(dispatch, request_factory=request_factory, handler_cancellation=True, access_log=None,
                          keepalive_timeout=self.settings.idle_timeout)


def _readable(handlers: dict) -> dict:
    """GET and HEAD routes for each path -> handler."""
    return {(method, path): handler for path, handler in handlers.items() for method in ("GET", "HEAD")}


async def _not_found(request: web.BaseRequest, allowed: tuple, known: str) -> web.Response:
    """404 for a path the listener does not serve, 405 for a method it does not serve there."""
    what = "method not allowed on" if allowed else "no such endpoint:"
    message = f"{what} {request.method} {request.path}; this listener serves {known}."
    error = ProxyError(405, message, headers={"Allow": ", ".join(allowed)}) if allowed else ProxyError(404, message)
    return error_response(error, own_headers(request)["X-Request-Id"])


def _proves(request: web.BaseRequest, secret: bytes) -> bool:
    """Whether the call carries the gateway's secret: Authorization: Bearer <secret>, compared in constant time."""
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode("utf-8", "replace"), secret)


def _within(peer: str | None, networks: tuple) -> bool:
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:  # None (not a TCP peer) or not an address
        return False
    address = getattr(address, "ipv4_mapped", None) or address  # a v4 caller on a [::] listener
    return any(address in network for network in networks)


async def _forbidden(request: web.BaseRequest, gateway: str) -> web.Response:
    message = (f"this host serves API calls through the gateway {gateway} only; send the request there "
               f"(with your caller key), not to the host's proxy")
    return error_response(ProxyError(403, message), own_headers(request)["X-Request-Id"])


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
        if config.tls_addr:
            await web.TCPSite(runner, *config.tls_addr, ssl_context=proxy.tls, backlog=2048).start()
        if config.admin_addr:
            admin = web.ServerRunner(proxy.make_server(proxy.admin_server_routes()), shutdown_timeout=5)
            await admin.setup()
            runners.append(admin)
            await web.TCPSite(admin, *config.admin_addr).start()
        log.info("dcu-proxy listening on %s%s (admin %s), %d backends", config.listen,
                 f" and {config.tls_listen} (TLS)" if config.tls_listen else "", config.admin_listen or "off",
                 len(config.backends))
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGHUP, proxy.reload)
        if ready is not None:
            ready()
        await stop.wait()
        proxy.relay.stopping = True
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
