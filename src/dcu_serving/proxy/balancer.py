"""Least-active routing over healthy backends, the proxy's own FIFO queue, health checks and ejection.

A request takes a slot before it is sent (`take`, or `wait` in the queue when none is free) and gives it
back (`release`) in a `finally`, so a count can neither leak nor go negative, cancellation included. When
every slot is busy the request waits here, in one FIFO shared by all cards, and the first slot freed
anywhere goes to the first waiter: a request queued inside one vLLM could not move to a card that frees up
sooner, one queued here can.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from datetime import UTC, datetime
from urllib.parse import urlsplit

from .errors import ProxyError
from .upstream import DeadlineExceeded, Pool, UpstreamError

log = logging.getLogger("dcu_proxy")


class Backend:
    """One vLLM instance (one card) and what the proxy knows about it."""

    __slots__ = ("active", "cap", "draining", "failures", "healthy", "last_check", "last_error", "name",
                 "pool", "removed", "served", "url")

    def __init__(self, url: str, cap: int, connect_timeout: float):
        parts = urlsplit(url)
        self.url = url
        self.pool = Pool(parts.hostname, parts.port, connect_timeout)
        self.name = self.pool.name  # host:port, the X-Backend value
        self.cap = cap
        self.active = 0
        self.served = 0
        self.failures = 0
        self.healthy = False  # nothing is routed to a backend before its first health check passes
        self.draining = False
        self.removed = False
        self.last_error: str | None = "not checked yet"
        self.last_check: float | None = None

    def status(self) -> dict:
        last_check = (datetime.fromtimestamp(self.last_check, UTC).isoformat(timespec="seconds")
                      if self.last_check is not None else None)
        return {"url": self.url, "healthy": self.healthy, "active": self.active, "cap": self.cap,
                "served": self.served, "failures": self.failures, "last_error": self.last_error,
                "last_check": last_check}


def no_backend(retry_after: int, why: str = "no healthy backend") -> ProxyError:
    return ProxyError(503, f"Service unavailable: {why}. Retry later; GET /__lb_status shows each card.",
                      headers={"Retry-After": str(retry_after)})


class Balancer:
    def __init__(self, urls, cap: int, queue_size: int, connect_timeout: float, retry_after: int = 1):
        self.loop = asyncio.get_running_loop()
        self.backends: list[Backend] = [Backend(u, cap, connect_timeout) for u in urls]
        self.queue_size = queue_size
        self.retry_after = retry_after
        self._routable: list[Backend] = []
        self._waiters: deque = deque()
        self.on_change = None  # called with (backend) when health or drain state changes

    # -- routing --

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def healthy_count(self) -> int:
        return sum(1 for b in self.backends if b.healthy)

    def _pick(self) -> Backend | None:
        """The routable backend with the fewest active requests and a free slot; ties at random."""
        best = None
        best_active = 0
        ties = 0
        for b in self._routable:
            active = b.active
            if active >= b.cap:
                continue
            if best is None or active < best_active:
                best, best_active, ties = b, active, 1
            elif active == best_active:
                ties += 1
                if random.random() * ties < 1.0:  # reservoir sampling: each tied backend equally likely
                    best = b
        return best

    def take(self, front: bool = False) -> Backend | None:
        """A free slot now, or None: then `wait` for one.

        A plain function, so a request that finds a slot free (most do) runs no coroutine for it. `front`
        is for a retried request: it has waited its turn already, so waiters do not hold it back.
        Raises ProxyError 503 when no backend is routable.
        """
        if not self._routable:
            raise no_backend(self.retry_after)
        if front or not self._waiters:
            b = self._pick()
            if b is not None:
                b.active += 1
                return b
        return None

    async def wait(self, deadline: float, front: bool = False) -> Backend:
        """Queue for the next free slot (after `take` found none) until `deadline` (loop time).

        `front` puts a retried request ahead of the queue, even a full one. Raises ProxyError 503 (queue
        full, or no routable backend left) or DeadlineExceeded.
        """
        if len(self._waiters) >= self.queue_size and not front:
            raise ProxyError(503, f"Service busy: all slots are in use and the proxy's queue is full "
                                  f"({self.queue_size} waiting). Retry after a moment.",
                             headers={"Retry-After": str(self.retry_after)})
        waiter = self.loop.create_future()
        if front:
            self._waiters.appendleft(waiter)
        else:
            self._waiters.append(waiter)
        timer = self.loop.call_at(deadline, _expire, waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(waiter.result(), served=False)  # handed a slot just as the caller went away
            raise
        finally:
            timer.cancel()
            if not waiter.done() or waiter.cancelled() or waiter.exception() is not None:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def release(self, backend: Backend, served: bool = True):
        if backend.active > 0:
            backend.active -= 1
        if served:
            backend.served += 1
        if self._waiters:
            self._dispatch()

    def _dispatch(self):
        waiters = self._waiters
        while waiters:
            b = self._pick()
            if b is None:
                return
            waiter = waiters.popleft()
            if waiter.done():
                continue
            b.active += 1
            waiter.set_result(b)

    def _refresh(self):
        self._routable = [b for b in self.backends if b.healthy and not b.draining]
        if not self._routable:
            why = "no healthy backend" if not any(b.healthy for b in self.backends) else \
                "every healthy backend is draining"
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(no_backend(self.retry_after, why))
        else:
            self._dispatch()

    # -- health --

    def eject(self, backend: Backend, reason: str):
        """Take a backend out of rotation at once; only a passing health check brings it back."""
        backend.failures += 1
        backend.last_error = reason
        if backend.healthy:
            backend.healthy = False
            log.warning("backend %s ejected: %s", backend.name, reason)
            backend.pool.close()
            self._refresh()
            self._changed(backend)

    def admit(self, backend: Backend):
        if not backend.healthy and not backend.removed:
            backend.healthy = True
            backend.last_error = None
            log.info("backend %s healthy, back in rotation", backend.name)
            self._refresh()
            self._changed(backend)

    def set_draining(self, backend: Backend, draining: bool):
        if backend.draining != draining:
            backend.draining = draining
            log.info("backend %s %s", backend.name, "draining" if draining else "undrained")
            self._refresh()
            self._changed(backend)

    def _changed(self, backend: Backend):
        if self.on_change is not None:
            self.on_change(backend)

    def find(self, ref: str) -> Backend | None:
        """A backend by URL or host:port."""
        ref = ref.rstrip("/")
        for b in self.backends:
            if ref in (b.url, b.name):
                return b
        return None

    async def check(self, backend: Backend, path: str, timeout: float):
        """One active health check: GET path must answer 200 within timeout."""
        deadline = self.loop.time() + timeout
        try:
            conn = await backend.pool.request(backend.pool.build_head(b"GET", path.encode(), b"", None),
                                              b"", deadline)
            status = conn.status
            try:
                await conn.read()
            finally:
                conn.release()
            error = None if status == 200 else f"{path} answered {status}"
        except DeadlineExceeded:
            error = f"{path} did not answer within {timeout:g} s"
        except UpstreamError as e:
            error = str(e)
        if backend.removed:
            return
        backend.last_check = time.time()
        if error is None:
            self.admit(backend)
        else:
            self.eject(backend, error)

    async def check_all(self, path: str, timeout: float):
        await asyncio.gather(*(self.check(b, path, timeout) for b in self.backends))

    # -- reload --

    def update(self, urls, cap: int, queue_size: int, connect_timeout: float, retry_after: int) -> list[Backend]:
        """Apply a reloaded backend list and settings; in-flight requests keep their backend.

        Returns the backends that are new (not yet health-checked).
        """
        current = {b.url: b for b in self.backends}
        kept, added = [], []
        for url in urls:
            b = current.pop(url, None)
            if b is None:
                b = Backend(url, cap, connect_timeout)
                added.append(b)
            b.cap = cap
            b.pool.connect_timeout = connect_timeout
            kept.append(b)
        for b in current.values():
            b.removed = True
            b.healthy = False
            b.pool.retired = True
            b.pool.close()
            log.info("backend %s removed (%d in flight finish there)", b.name, b.active)
        self.backends = kept
        self.queue_size = queue_size
        self.retry_after = retry_after
        self._refresh()
        return added

    def close(self):
        for b in self.backends:
            b.pool.close()


def _expire(waiter: asyncio.Future):
    if not waiter.done():
        waiter.set_exception(DeadlineExceeded())
