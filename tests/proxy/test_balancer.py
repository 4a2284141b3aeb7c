"""The balancer in-process: tie-breaking, slot accounting under cancellation, the queue, drain, reload.

Slots are taken as the relay takes them: `take()` now, or `wait()` in the queue when it found none."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from dcu_serving.proxy.balancer import Balancer
from dcu_serving.proxy.errors import ProxyError
from dcu_serving.proxy.upstream import DeadlineExceeded

URLS = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]


def healthy_balancer(cap: int = 2, queue_size: int = 10, urls=URLS) -> Balancer:
    balancer = Balancer(urls, cap, queue_size, connect_timeout=1)
    for b in balancer.backends:
        balancer.admit(b)
    return balancer


def later(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def test_ties_are_broken_at_random_and_the_least_active_wins():
    balancer = healthy_balancer(cap=100)
    chosen = Counter()
    for _ in range(3000):
        b = balancer.take()
        chosen[b.url] += 1
        balancer.release(b)
    assert set(chosen) == set(URLS)
    assert all(800 < n < 1200 for n in chosen.values()), chosen  # each about a third, not "the first"
    first = balancer.take()
    others = {balancer.take().url for _ in range(2)}
    assert first.url not in others and len(others) == 2  # a busy backend is not picked while others idle


async def test_counts_never_leak_or_go_negative():
    balancer = healthy_balancer(cap=1, urls=URLS[:1])
    b = balancer.take()
    balancer.release(b)
    balancer.release(b)  # a double release must not make room for two
    assert b.active == 0
    b = balancer.take()
    assert balancer.take() is None  # the only slot is taken: the next request waits
    waiter = asyncio.ensure_future(balancer.wait(later(5)))
    await asyncio.sleep(0)
    assert balancer.queued == 1
    balancer.release(b)  # the slot is handed to the waiter...
    waiter.cancel()      # ...which is cancelled before it runs: the slot must come back
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert b.active == 0 and balancer.queued == 0


async def test_waiting_past_the_deadline_raises_and_leaves_the_queue():
    balancer = healthy_balancer(cap=1, urls=URLS[:1])
    assert balancer.take() is not None
    assert balancer.take() is None
    with pytest.raises(DeadlineExceeded):
        await balancer.wait(later(0.05))
    assert balancer.queued == 0


async def test_no_routable_backend_is_503_now_and_for_the_waiters():
    balancer = healthy_balancer(cap=1, urls=URLS[:2])
    for _ in range(2):
        assert balancer.take() is not None
    waiter = asyncio.ensure_future(balancer.wait(later(5)))
    await asyncio.sleep(0)
    for b in balancer.backends:
        balancer.eject(b, "connection refused")
    with pytest.raises(ProxyError) as e:
        await waiter
    assert e.value.status == 503 and e.value.headers == {"Retry-After": "1"}
    with pytest.raises(ProxyError):
        balancer.take()
    assert [b.failures for b in balancer.backends] == [1, 1]


async def test_drain_takes_no_new_work_and_undrain_serves_the_queue():
    balancer = healthy_balancer(cap=1, urls=URLS[:2])
    a, b = balancer.backends
    balancer.set_draining(a, True)
    got = balancer.take()
    assert got is b
    assert balancer.take() is None  # the drained backend's free slot is not offered
    waiter = asyncio.ensure_future(balancer.wait(later(5)))
    await asyncio.sleep(0)
    assert not waiter.done()
    balancer.set_draining(a, False)
    assert await waiter is a


async def test_reload_keeps_state_of_known_backends_and_checks_new_ones():
    balancer = healthy_balancer(cap=2)
    kept = balancer.take()
    added = balancer.update([kept.url, "http://127.0.0.1:9"], cap=3, queue_size=5, connect_timeout=1,
                            retry_after=2)
    assert [b.url for b in added] == ["http://127.0.0.1:9"] and not added[0].healthy
    assert [b.url for b in balancer.backends] == [kept.url, "http://127.0.0.1:9"]
    assert kept.active == 1 and kept.cap == 3
    for _ in range(2):
        assert balancer.take() is kept  # the only routable one
    removed = healthy_balancer(cap=1, urls=URLS[:2])
    gone = removed.take()
    removed.update([u for u in URLS[:2] if u != gone.url], 1, 5, 1, 1)
    removed.release(gone)  # in-flight work on a removed backend ends normally
    assert gone.active == 0 and gone.removed and gone.pool.retired


async def test_a_retried_request_goes_ahead_of_the_queue_even_a_full_one():
    balancer = healthy_balancer(cap=1, queue_size=1, urls=URLS[:2])
    a, b = balancer.take(), balancer.take()
    queued = asyncio.ensure_future(balancer.wait(later(5)))
    await asyncio.sleep(0)
    with pytest.raises(ProxyError) as full:
        await balancer.wait(later(5))
    assert full.value.status == 503 and balancer.queued == 1
    retried = asyncio.ensure_future(balancer.wait(later(5), front=True))  # its first backend was unreachable
    await asyncio.sleep(0)
    assert balancer.queued == 2
    balancer.release(a)
    assert await retried is a and not queued.done()
    balancer.release(b)
    assert await queued is b

