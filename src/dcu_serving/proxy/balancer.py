"""Least-active routing over healthy backends, the proxy's own FIFO queues, health checks and ejection.

Backends are grouped into pools by the models they serve (`Group`; the default layout is one pool of every
card). A request takes a slot from its model's pool before it is sent (`take`, or `wait` in that pool's queue
when none is free) and gives it back (`release`) in a `finally`, so a count can neither leak nor go negative,
cancellation included. When every slot of a pool is busy the request waits here, in the pool's queue, and the
first slot freed on any of the pool's backends goes to the waiter the pool's order picks (queueing.py: the
cheapest expected work first within an aging bound, or FIFO): a request queued inside one vLLM could not move
to a card that frees up sooner, one queued here can. Pools do not share queues, so a full or failed pool holds
up no other model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import deque
from datetime import UTC, datetime
from urllib.parse import urlsplit

from . import queueing
from .config import BackendSpec
from .errors import ProxyError
from .queueing import Speed, Waiter
from .upstream import DeadlineExceeded, Pool, UpstreamError

log = logging.getLogger("dcu_proxy")


class Backend:
    """One vLLM instance (one card, or several under tensor parallelism) and what the proxy knows about it."""

    __slots__ = ("active", "cap", "draining", "failures", "group", "healthy", "last_check", "last_error", "name",
                 "pool", "removed", "served", "spec", "url")

    def __init__(self, spec: BackendSpec, cap: int, connect_timeout: float):
        parts = urlsplit(spec.url)
        self.url = spec.url
        self.spec = spec
        self.group: Group | None = None  # the model pool it serves in (set by the Balancer)
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
                "last_check": last_check, "models": list(self.spec.models), "kind": self.spec.kind,
                "draining": self.draining}


def no_backend(retry_after: int, why: str = "no healthy backend") -> ProxyError:
    return ProxyError(503, f"Service unavailable: {why}. Retry later; GET /__lb_status shows each card.",
                      headers={"Retry-After": str(retry_after)})


class Group:
    """The backends that serve one list of models (a pool): least-active routing among them and their own queue,
    so a pool that is full or down holds up no other model's requests.

    `by_cost`: the queue hands a freed slot to the cheapest expected work within the aging bound (`aging`), else
    to the first waiter (queueing.py). `reserve` (with `by_cost` only): the last free slots of the pool that only
    a cheap request may take (queue_reserve). `speed` is what the pool's answers showed of its model."""

    __slots__ = ("_routable", "_waiters", "aging", "backends", "by_cost", "kind", "loop", "max_model_len", "models",
                 "queue_size", "reserve", "retry_after", "shared", "speed")

    def __init__(self, models: tuple, kind: str, queue_size: int, retry_after: int, shared: bool,
                 by_cost: bool = False, aging: float = 4.0, reserve: int = 0):
        self.loop = asyncio.get_running_loop()
        self.models = models
        self.kind = kind
        self.max_model_len: int | None = None
        self.queue_size = queue_size
        self.retry_after = retry_after
        self.shared = shared  # the only pool: messages need not name its models
        self.by_cost = by_cost
        self.aging = aging
        self.reserve = reserve if by_cost else 0
        self.speed = Speed()
        self.backends: list[Backend] = []
        self._routable: list[Backend] = []
        self._waiters: deque[Waiter] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def _unavailable(self, why: str) -> ProxyError:
        if not self.shared:
            why = f"{why} for {', '.join(f'`{m}`' for m in self.models)}"
        return no_backend(self.retry_after, why)

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

    def _free(self) -> int:
        """The pool's free slots (counted only with a reserve: never on the plain path)."""
        return sum(b.cap - b.active for b in self._routable if b.active < b.cap)

    def take(self, front: bool = False) -> Backend | None:
        """A free slot now, or None: then `wait` for one.

        A plain function, so a request that finds a slot free (most do) runs no coroutine for it. `front`
        is for a retried request: it has waited its turn already, so waiters do not hold it back. With a
        reserve, only a request that finds more than `reserve` slots free takes one here: with fewer its cost
        decides (`wait`).
        Raises ProxyError 503 when no backend of the pool is routable.
        """
        if not self._routable:
            raise self._unavailable("no healthy backend")
        if front or not self._waiters:
            b = self._pick()
            if b is not None and (front or not self.reserve or self._free() > self.reserve):
                b.active += 1
                return b
        return None

    def admits(self):
        """Raise the 503 a request would get from `take` or `wait` now (no routable backend; every slot busy and
        the queue full), before its body is read."""
        if not self._routable:
            raise self._unavailable("no healthy backend")
        if len(self._waiters) >= self.queue_size and self._pick() is None:
            raise self._full()

    def _full(self) -> ProxyError:
        whose = "" if self.shared else f" of {', '.join(f'`{m}`' for m in self.models)}"
        return ProxyError(503, f"Service busy: all slots{whose} are in use and the proxy's queue is full "
                               f"({self.queue_size} waiting). Retry after a moment.",
                          headers={"Retry-After": str(self.retry_after)})

    async def wait(self, deadline: float, front: bool = False,
                   estimate: queueing.Estimate | None = None) -> Backend:
        """Queue for the pool's next free slot (after `take` found none) until `deadline` (loop time).

        `front` puts a retried request ahead of the queue, even a full one. `estimate`: what the request says
        of its cost, which orders a pool queued by cost (None: as cheap as any). Raises ProxyError 503 (queue
        full, or no routable backend left) or DeadlineExceeded.
        """
        waiters = self._waiters
        if len(waiters) >= self.queue_size and not front:
            raise self._full()
        future = self.loop.create_future()
        if front:  # it waited its turn already: overtaken by no one
            waiter = Waiter(future, -1.0, 0)
            waiters.appendleft(waiter)
        else:
            cost = queueing.order_cost(self.speed.seconds(estimate)) if estimate is not None else 0.0
            waiter = Waiter(future, cost, queueing.slack(self.aging, len(waiters)), estimate)
            waiters.append(waiter)
            if self.reserve and self._pick() is not None:  # a reserved slot is free: a cheap request takes it now
                self._dispatch()
        timer = self.loop.call_at(deadline, _expire, future)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result(), served=False)  # handed a slot just as the caller went away
            raise
        finally:
            timer.cancel()
            if not future.done() or future.cancelled() or future.exception() is not None:
                with contextlib.suppress(ValueError):
                    waiters.remove(waiter)

    def release(self, backend: Backend, served: bool = True):
        """Give back a slot taken from this pool (or from the pool the backend was in before a reload)."""
        if backend.active > 0:
            backend.active -= 1
        if served:
            backend.served += 1
        group = backend.group
        if group is not None and group._waiters:
            group._dispatch()

    def _dispatch(self):
        waiters = self._waiters
        reserve = self.reserve
        while waiters:
            b = self._pick()
            if b is None:
                return
            if self.by_cost:
                free = self._free() if reserve else math.inf
                i = queueing.pick(waiters, free, reserve)
                if i < 0:  # a reserved slot, and no cheap request waits: it stays free
                    return
                future = waiters[i].future
                if future.done():  # gone (deadline, caller) and not yet out of the queue
                    del waiters[i]
                    continue
                queueing.overtake(waiters, i)
                del waiters[i]
            else:
                future = waiters.popleft().future
                if future.done():
                    continue
            b.active += 1
            future.set_result(b)

    def _refresh(self):
        self._routable = [b for b in self.backends if b.healthy and not b.draining]
        if not self._routable:
            why = "no healthy backend" if not any(b.healthy for b in self.backends) else \
                "every healthy backend is draining"
            self._fail_waiters(self._unavailable(why))
        else:
            self._dispatch()

    def _fail_waiters(self, error: ProxyError):
        while self._waiters:
            future = self._waiters.popleft().future
            if not future.done():
                future.set_exception(error)

    def queued_by_cost(self) -> dict[str, int]:
        """Waiting requests per cost class (queueing.COST_CLASSES), a retried one in the cheapest."""
        counts = dict.fromkeys([name for _, name in queueing.COST_CLASSES], 0)
        for w in self._waiters:
            counts[queueing.cost_class(self.speed.seconds(w.estimate) if w.estimate is not None else 0.0)] += 1
        return counts

    def status(self) -> dict:
        return {"kind": self.kind, "healthy": sum(1 for b in self.backends if b.healthy),
                "total": len(self.backends), "active": sum(b.active for b in self.backends),
                "queue": len(self._waiters), "queue_by_cost": self.queued_by_cost(),
                "queue_policy": "cost" if self.by_cost else "fifo", "queue_reserve": self.reserve,
                "speed": self.speed.status(),
                "backends": [b.url for b in self.backends]}


def _spec(item) -> BackendSpec:
    """A BackendSpec, or a bare URL (one pool of every backend: what the balancer's own tests build)."""
    return BackendSpec(item, ()) if isinstance(item, str) else item


class Balancer:
    """Every backend, grouped into pools by the models they serve, with health checks, ejection and drain.

    `by_model` maps each served model name to its pool; a request takes a slot from its model's pool.
    """

    def __init__(self, specs, cap: int, queue_size: int, connect_timeout: float, retry_after: int = 1,
                 queue_policy: str = "fifo", queue_aging: float = 4.0, queue_reserve: int = 0):
        self.loop = asyncio.get_running_loop()
        self.backends: list[Backend] = []
        self.groups: list[Group] = []
        self.by_model: dict[str, Group] = {}
        self.queue_size = queue_size
        self.retry_after = retry_after
        self.on_change = None  # called with (backend) when health or drain state changes
        self.update(specs, cap, queue_size, connect_timeout, retry_after, queue_policy, queue_aging, queue_reserve)

    # -- routing (the pools do it; these serve the single-pool case and the totals) --

    @property
    def queued(self) -> int:
        return sum(len(g._waiters) for g in self.groups)

    @property
    def healthy_count(self) -> int:
        return sum(1 for b in self.backends if b.healthy)

    def take(self, front: bool = False) -> Backend | None:
        """A free slot of the only pool (see Group.take)."""
        return self._only().take(front)

    async def wait(self, deadline: float, front: bool = False) -> Backend:
        """Queue in the only pool (see Group.wait)."""
        return await self._only().wait(deadline, front)

    def release(self, backend: Backend, served: bool = True):
        backend.group.release(backend, served)

    def _only(self) -> Group:
        if len(self.groups) != 1:
            raise ValueError(f"{len(self.groups)} pools: take a slot from a pool (Balancer.by_model)")
        return self.groups[0]

    # -- health --

    def eject(self, backend: Backend, reason: str):
        """Take a backend out of rotation at once; only a passing health check brings it back."""
        backend.failures += 1
        backend.last_error = reason
        if backend.healthy:
            backend.healthy = False
            log.warning("backend %s ejected: %s", backend.name, reason)
            backend.pool.close()
            backend.group._refresh()
            self._changed(backend)

    def admit(self, backend: Backend):
        if not backend.healthy and not backend.removed:
            backend.healthy = True
            backend.last_error = None
            log.info("backend %s healthy, back in rotation", backend.name)
            backend.group._refresh()
            self._changed(backend)

    def set_draining(self, backend: Backend, draining: bool):
        if backend.draining != draining:
            backend.draining = draining
            log.info("backend %s %s", backend.name, "draining" if draining else "undrained")
            backend.group._refresh()
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

    def update(self, specs, cap: int, queue_size: int, connect_timeout: float, retry_after: int,
               queue_policy: str = "fifo", queue_aging: float = 4.0, queue_reserve: int = 0) -> list[Backend]:
        """Apply a (re)loaded backend list and settings; in-flight requests keep their backend.

        `specs` are BackendSpecs (or bare URLs). A pool whose models are unchanged stays the same object, its
        queue with it; a backend whose models changed moves to its new pool. Requests queued for models no
        backend serves any more get 503. Returns the backends that are new (not yet health-checked).
        """
        specs = [_spec(s) for s in specs]
        current = {b.url: b for b in self.backends}
        groups = {g.models: g for g in self.groups}
        shared = len({s.models for s in specs}) == 1
        kept, added, new_groups = [], [], {}
        for spec in specs:
            b = current.pop(spec.url, None)
            if b is None:
                b = Backend(spec, cap, connect_timeout)
                added.append(b)
            b.spec = spec
            b.cap = spec.concurrency or cap
            b.pool.connect_timeout = connect_timeout
            kept.append(b)
            group = new_groups.get(spec.models)
            if group is None:
                group = groups.pop(spec.models, None) or Group(spec.models, spec.kind, queue_size, retry_after, shared)
                group.backends = []
                group.max_model_len = None
                new_groups[spec.models] = group
            group.kind, group.queue_size, group.retry_after, group.shared = spec.kind, queue_size, retry_after, shared
            group.by_cost, group.aging = queue_policy == "cost", queue_aging
            group.reserve = queue_reserve if group.by_cost else 0
            if spec.max_model_len is not None:
                group.max_model_len = spec.max_model_len
            group.backends.append(b)
            b.group = group
        for b in current.values():
            b.removed = True
            b.healthy = False
            b.pool.retired = True
            b.pool.close()
            log.info("backend %s removed (%d in flight finish there)", b.name, b.active)
        for gone in groups.values():  # pools of models no longer served: nobody will free a slot for them
            gone.backends = []
            gone._fail_waiters(ProxyError(503, f"Service unavailable: {', '.join(f'`{m}`' for m in gone.models)} "
                                               f"is no longer served here (the configuration was reloaded).",
                                          headers={"Retry-After": str(retry_after)}))
        self.backends = kept
        self.groups = list(new_groups.values())
        self.by_model = {model: g for g in self.groups for model in g.models}
        self.queue_size = queue_size
        self.retry_after = retry_after
        for g in self.groups:
            g._refresh()
        return added

    def close(self):
        for b in self.backends:
            b.pool.close()


def _expire(waiter: asyncio.Future):
    if not waiter.done():
        waiter.set_exception(DeadlineExceeded())
