"""The balancer in-process: tie-breaking, slot accounting under cancellation, the queue, drain, reload.

Slots are taken as the relay takes them: `take()` now, or `wait()` in the queue when it found none."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from dcu_serving.proxy.balancer import Balancer
from dcu_serving.proxy.config import BackendSpec
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



# -- pools: backends grouped by the models they serve, each with its own queue --

def pooled_balancer(cap: int = 1, queue_size: int = 1) -> Balancer:
    specs = [BackendSpec(URLS[0], ("chat-a",), "chat"), BackendSpec(URLS[1], ("chat-a",), "chat"),
             BackendSpec(URLS[2], ("bge-m3", "embed"), "embedding")]
    balancer = Balancer(specs, cap, queue_size, connect_timeout=1)
    for b in balancer.backends:
        balancer.admit(b)
    return balancer


async def test_each_model_takes_slots_from_its_own_pool():
    balancer = pooled_balancer(cap=5)
    chat, embed = balancer.by_model["chat-a"], balancer.by_model["embed"]
    assert balancer.by_model["bge-m3"] is embed and [b.url for b in embed.backends] == [URLS[2]]
    assert {chat.take().url for _ in range(10)} == set(URLS[:2])
    assert {embed.take().url for _ in range(5)} == {URLS[2]}
    with pytest.raises(ValueError):
        balancer.take()  # several pools: a slot is taken from a model's pool, not from the balancer


async def test_a_full_pool_does_not_hold_up_another_model():
    balancer = pooled_balancer(cap=1, queue_size=1)
    chat, embed = balancer.by_model["chat-a"], balancer.by_model["embed"]
    held = [chat.take(), chat.take()]
    assert chat.take() is None
    queued = asyncio.ensure_future(chat.wait(later(5)))
    await asyncio.sleep(0)
    with pytest.raises(ProxyError) as full:
        await chat.wait(later(5))
    assert full.value.status == 503 and "`chat-a`" in full.value.message
    got = embed.take()  # the embeddings pool is idle: no queue, no 503
    assert got.url == URLS[2] and (chat.queued, embed.queued, balancer.queued) == (1, 0, 1)
    embed.release(got)
    chat.release(held[0])
    assert (await queued) is held[0]


async def test_a_failed_pool_fails_its_own_waiters_only():
    balancer = pooled_balancer(cap=1, queue_size=5)
    chat, embed = balancer.by_model["chat-a"], balancer.by_model["embed"]
    embed_slot = embed.take()
    embed_waiter = asyncio.ensure_future(embed.wait(later(5)))
    chat_slots = [chat.take(), chat.take()]
    chat_waiter = asyncio.ensure_future(chat.wait(later(5)))
    await asyncio.sleep(0)
    balancer.eject(balancer.backends[2], "connection refused")
    with pytest.raises(ProxyError) as e:
        await embed_waiter
    assert e.value.status == 503 and "no healthy backend for `bge-m3`, `embed`" in e.value.message
    with pytest.raises(ProxyError):
        embed.take()
    assert not chat_waiter.done()
    chat.release(chat_slots[0])
    assert await chat_waiter is chat_slots[0]
    embed.release(embed_slot)
    assert embed_slot.active == 0


async def test_reload_moves_backends_between_pools_and_drops_pools_no_longer_served():
    balancer = pooled_balancer(cap=1, queue_size=5)
    chat, embed = balancer.by_model["chat-a"], balancer.by_model["embed"]
    busy = embed.take()
    waiter = asyncio.ensure_future(embed.wait(later(5)))
    await asyncio.sleep(0)
    balancer.update([BackendSpec(URLS[0], ("chat-a",), "chat"), BackendSpec(URLS[1], ("chat-a",), "chat"),
                     BackendSpec(URLS[2], ("chat-a",), "chat")], 1, 5, 1, 1)
    assert balancer.by_model == {"chat-a": chat} and len(chat.backends) == 3  # the same pool, one more card
    with pytest.raises(ProxyError) as e:
        await waiter
    assert e.value.status == 503 and "no longer served" in e.value.message
    assert busy.group is chat and busy.active == 1
    embed.release(busy)  # the slot taken before the reload comes back to the card, now in the chat pool
    assert busy.active == 0 and chat.take() is not None
