"""The order of a pool's queue: the decision as a pure function (queueing.pick), then the pool that follows it.

The pure part is played as a queue would be: requests arrive (each with the slack it gets for its place in line),
a freed slot goes to the one `pick` names, the ones ahead of it are overtaken. The pool part runs real futures on
the event loop through Balancer.take/wait/release, as the relay does."""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
from proxy.proxytools import body, slow

from dcu_serving.proxy import queueing
from dcu_serving.proxy.balancer import Balancer
from dcu_serving.proxy.queueing import Estimate, Speed, Waiter, estimate, pick
from support import wait_until


class Line:
    """A queue played with the pure functions: arrivals get their slack, a hand-out follows `pick`."""

    def __init__(self, aging: float):
        self.aging = aging
        self.waiting: list[Waiter] = []
        self.served: list[str] = []

    def arrive(self, name: str, cost: float):
        self.waiting.append(Waiter(name, cost, queueing.slack(self.aging, len(self.waiting))))

    def hand_out(self) -> str:
        i = pick(self.waiting)
        queueing.overtake(self.waiting, i)
        name = self.waiting.pop(i).future
        self.served.append(name)
        return name


def test_equal_costs_are_served_in_arrival_order():
    line = Line(aging=math.inf)
    for i in range(20):
        line.arrive(f"r{i}", 1.5)
    assert [line.hand_out() for _ in range(20)] == [f"r{i}" for i in range(20)]


def test_ties_go_to_the_first_to_arrive_and_cheaper_work_goes_first():
    line = Line(aging=math.inf)
    for name, cost in (("long", 9.0), ("short-a", 0.1), ("mid", 2.0), ("short-b", 0.1)):
        line.arrive(name, cost)
    assert [line.hand_out() for _ in range(4)] == ["short-a", "short-b", "mid", "long"]


def test_aging_one_is_fifo_whatever_the_costs():
    line = Line(aging=1.0)
    for name, cost in (("long", 9.0), ("short", 0.1), ("mid", 2.0)):
        line.arrive(name, cost)
    assert [line.hand_out() for _ in range(3)] == ["long", "short", "mid"]


@pytest.mark.parametrize("aging", [1.5, 2.0, 4.0])
@pytest.mark.parametrize("ahead", [0, 3, 10])
def test_a_long_request_under_a_flood_of_short_ones_is_served_within_its_bound(aging, ahead):
    """The starvation bound: a request that found `ahead` others waiting gets a slot within aging * (ahead + 1)
    hand-outs, however many cheaper requests keep arriving (one after each hand-out: a flood)."""
    line = Line(aging)
    for i in range(ahead):
        line.arrive(f"before-{i}", 1.0)
    line.arrive("long", 100.0)
    bound = math.floor(aging * (ahead + 1))
    hand_outs = 0
    for i in range(1000):
        line.arrive(f"short-{i}", 0.01)
        hand_outs += 1
        if line.hand_out() == "long":
            break
    assert "long" in line.served, "starved"
    assert hand_outs <= bound
    overtook = [n for n in line.served[:-1] if n.startswith("short")]
    assert len(overtook) == queueing.slack(aging, ahead)  # it used its slack, and no more


def test_nothing_behind_a_request_whose_slack_is_spent_goes_first():
    waiting = [Waiter("a", 5.0, 1), Waiter("b", 9.0, 0), Waiter("cheap", 0.1, 3)]
    assert pick(waiting) == 0  # "cheap" is behind "b", which may be overtaken no more; "a" is cheaper than "b"
    waiting = [Waiter("b", 9.0, 0), Waiter("cheap", 0.1, 3)]
    assert pick(waiting) == 0


# -- the reserve (queue_reserve): the pool's last free slots only for cheap requests --

def test_a_reserved_slot_goes_only_to_a_cheap_request():
    dear, cheap = Waiter("dear", 5.0, 3), Waiter("cheap", 0.2, 3)
    assert pick([dear], free=3, reserve=2) == 0  # more free than reserved: anyone
    assert pick([dear], free=2, reserve=2) == -1  # one of the reserved ones: it stays free
    assert pick([dear, cheap], free=1, reserve=2) == 1
    assert pick([cheap, dear], free=1, reserve=2) == 0
    assert pick([dear], free=1, reserve=0) == 0  # no reserve: the order alone


def test_the_reserve_holds_back_no_request_whose_slack_is_spent():
    """A dear request that may be overtaken no more is due: it takes a reserved slot, and nothing behind it (a
    cheap one included) goes first; with slack left it waits for a slot the reserve does not hold."""
    waiting = [Waiter("spent", 9.0, 0), Waiter("cheap", 0.1, 2)]
    assert pick(waiting, free=1, reserve=1) == 0
    waiting = [Waiter("dear", 5.0, 2), Waiter("spent", 9.0, 0), Waiter("cheap", 0.1, 2)]
    assert pick(waiting, free=1, reserve=1) == 0  # ahead of the due one, and the cheaper of the two
    waiting = [Waiter("dear", 5.0, 2), Waiter("cheap", 0.1, 2)]
    assert pick(waiting, free=1, reserve=1) == 1


def test_equal_costs_with_a_reserve_are_served_in_arrival_order():
    for cost in (0.2, 5.0):  # all cheap, or all dear with slots to spare
        line = Line(aging=math.inf)
        for i in range(10):
            line.arrive(f"r{i}", cost)
        order = []
        for _ in range(10):
            i = pick(line.waiting, free=5, reserve=1)
            order.append(line.waiting.pop(i).future)
        assert order == [f"r{i}" for i in range(10)]


@pytest.mark.parametrize("aging", [1.5, 4.0])
@pytest.mark.parametrize("reserve", [1, 4])
def test_the_aging_bound_holds_with_a_reserve_under_a_flood_of_short_requests(aging, reserve):
    """Every slot freed is a reserved one (a short request took each slot the moment it freed, so no more than
    `reserve` are ever free) and a short request arrives after each hand-out: a long request that found 3
    waiting is still served within aging * 4 hand-outs, and overtaken by no more short requests than its slack."""
    line = Line(aging)
    for i in range(3):
        line.arrive(f"before-{i}", 2.0 + i)
    line.arrive("long", 100.0)
    for i in range(1000):
        line.arrive(f"short-{i}", 0.01)
        j = pick(line.waiting, free=reserve, reserve=reserve)
        assert j >= 0
        queueing.overtake(line.waiting, j)
        line.served.append(line.waiting.pop(j).future)
        if line.served[-1] == "long":
            break
    assert "long" in line.served, "starved"
    assert len(line.served) <= math.floor(aging * 4)
    assert len([n for n in line.served if n.startswith("short")]) == queueing.slack(aging, 3)


def test_costs_within_a_factor_of_two_keep_arrival_order():
    assert [queueing.order_cost(s) for s in (0.05, 1.0, 1.4, 1.45, 1.6, 2.5, 0.0, -1.0)] == \
        [0.0625, 1.0, 1.0, 2.0, 2.0, 2.0, 0.0, -1.0]
    line = Line(aging=math.inf)
    for name, seconds in (("long-a", 1.62), ("long-b", 1.50), ("short", 0.07), ("long-c", 1.55)):
        line.arrive(name, queueing.order_cost(seconds))
    assert [line.hand_out() for _ in range(4)] == ["short", "long-a", "long-b", "long-c"]


def test_slack_grows_with_the_place_in_line():
    assert [queueing.slack(4.0, ahead) for ahead in (0, 1, 7)] == [3, 6, 24]
    assert queueing.slack(1.0, 50) == 0
    assert queueing.slack(math.inf, 0) == math.inf


def test_estimate_reads_the_cap_thinking_images_and_prompt():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 4000}}
    payload = {"model": "m", "max_tokens": 300, "chat_template_kwargs": {"enable_thinking": True},
               "messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 400}, image, image]}]}
    e = estimate(payload, size=8600)
    assert (e.output, e.thinking) == (300, True)
    assert e.prompt == pytest.approx((8600 - 2 * 4022) / 4 + 2 * queueing.IMAGE_TOKENS)
    uncapped = estimate({"model": "m", "messages": []}, size=40)
    assert (uncapped.output, uncapped.thinking) == (None, None)
    assert estimate({"max_tokens": True, "max_completion_tokens": 0}, 10).output is None
    assert estimate(None, size=1 << 20).prompt is None  # an embedding or an upload: known by its size


def test_speed_orders_by_seconds_and_learns_what_uncapped_requests_cost():
    speed = Speed()
    short, long = Estimate(100, 8), Estimate(100, 300)
    assert speed.seconds(short) < speed.seconds(long)
    uncapped = Estimate(100, None, thinking=False)
    before = speed.seconds(uncapped)
    for _ in range(60):  # answers of 20 tokens, 1 s each after 0.2 s in the queue (non-streamed)
        speed.learn(uncapped, {"status": 200, "queue_ms": 200.0, "completion_tokens": 20, "prompt_tokens": 100,
                               "ttft_ms": None}, 1.2)
    assert speed.output[False] == pytest.approx(20, rel=0.05)
    assert speed.seconds(uncapped) < before
    assert speed.seconds(Estimate(100, 20)) == pytest.approx(1.0, rel=0.1)  # 1 s on the card, as observed
    speed.learn(uncapped, {"status": 500, "queue_ms": 0.0, "completion_tokens": 9999, "prompt_tokens": 1,
                           "ttft_ms": None}, 1.0)
    assert speed.output[False] == pytest.approx(20, rel=0.05)  # a failed answer teaches nothing
    for _ in range(60):  # a stream: 0.1 s to the first token after 0.1 s queued, then 10 ms per token
        speed.learn(Estimate(1000, 101), {"status": 200, "queue_ms": 100.0, "completion_tokens": 101,
                                          "prompt_tokens": 1000, "ttft_ms": 200.0}, 1.2)
    assert speed.token_s == pytest.approx(0.010, rel=0.05)
    assert speed.prompt_s == pytest.approx(0.0001, rel=0.05)
    for _ in range(60):
        speed.learn(Estimate(size=1000), {"status": 200, "queue_ms": 0.0, "completion_tokens": None,
                                          "prompt_tokens": None, "ttft_ms": None}, 0.5)
    assert speed.seconds(Estimate(size=2000)) == pytest.approx(1.0, rel=0.05)


def test_cost_classes():
    assert [queueing.cost_class(s) for s in (0.05, 1.0, 3, 59, 600)] == ["0-1s", "0-1s", "1-10s", "10-60s", "60s+"]


# -- the pool that follows the order --

def one_card(policy: str, aging: float = 4.0, cap: int = 1, queue_size: int = 100, reserve: int = 0) -> Balancer:
    balancer = Balancer(["http://127.0.0.1:1"], cap, queue_size, connect_timeout=1, queue_policy=policy,
                        queue_aging=aging, queue_reserve=reserve)
    balancer.admit(balancer.backends[0])
    return balancer


def later(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def queue_up(balancer: Balancer, requests: list[tuple[str, int]]) -> tuple[list, list]:
    """Occupy the card, queue `requests` (name, max_tokens) in that order; return (tasks, order served)."""
    group = balancer.groups[0]
    busy = group.take()
    assert busy is not None and group.take() is None
    served: list[str] = []

    async def one(name: str, max_tokens: int):
        b = await group.wait(later(10), estimate=estimate({"max_tokens": max_tokens}, 100))
        served.append(name)
        await asyncio.sleep(0)
        group.release(b)

    tasks = []
    for name, max_tokens in requests:
        tasks.append(asyncio.ensure_future(one(name, max_tokens)))
        await asyncio.sleep(0)
    assert group.queued == len(requests)
    group.release(busy)
    return tasks, served


async def test_a_pool_queued_by_cost_serves_short_work_first_and_fifo_does_not():
    order = [("long-1", 300), ("short-1", 8), ("long-2", 300), ("short-2", 8)]
    for policy, expected in (("cost", ["short-1", "short-2", "long-1", "long-2"]),
                             ("fifo", ["long-1", "short-1", "long-2", "short-2"])):
        balancer = one_card(policy)
        tasks, served = await queue_up(balancer, order)
        await asyncio.gather(*tasks)
        assert served == expected, policy
        assert balancer.backends[0].active == 0


@pytest.mark.parametrize("reserve", [0, 1])
async def test_a_pool_queued_by_cost_keeps_its_bound_under_a_flood(reserve):
    """A long request behind 2 others, then one short request after each hand-out: the long one is served within
    aging * 3 hand-outs, and the pool's status shows the queue by cost class meanwhile. With a reserve the card
    has 2 slots, 1 kept for short requests: it holds back no request whose slack is spent."""
    balancer = one_card("cost", aging=2.0, cap=1 + reserve, reserve=reserve)
    group = balancer.groups[0]
    tasks, served = await queue_up(balancer, [("a", 300), ("b", 300), ("long", 4000)])
    status = group.status()  # "a" has the freed slot (cheaper than "long"), "b" and "long" wait
    assert status["queue_policy"] == "cost" and status["queue"] == 2
    assert status["queue_by_cost"] == {"0-1s": 0, "1-10s": 1, "10-60s": 0, "60s+": 1}
    flood = 0
    while "long" not in served:
        flood += 1
        name = f"short-{flood}"
        tasks.append(asyncio.ensure_future(_short(group, name, served)))
        await asyncio.sleep(0.001)
        assert flood < 50, served
    assert served.index("long") + 1 <= 2 * 3
    assert len([n for n in served[:served.index("long")] if n.startswith("short")]) == 3  # slack (2-1)*(2+1)
    await asyncio.gather(*tasks)


async def _short(group, name: str, served: list):
    b = group.take() or await group.wait(later(10), estimate=estimate({"max_tokens": 8}, 100))
    served.append(name)
    await asyncio.sleep(0.002)
    group.release(b)


async def test_requests_alike_keep_their_order_while_the_learnt_speed_moves():
    """Two requests of 300 tokens, the second queued after the pool's speed was learnt 10 % faster (as answers
    move it): it is estimated a little cheaper, but not a factor of two, so the first keeps its turn."""
    balancer = one_card("cost")
    group = balancer.groups[0]
    busy = group.take()
    served: list[str] = []

    async def one(name: str):
        b = await group.wait(later(5), estimate=estimate({"max_tokens": 300}, 100))
        served.append(name)
        group.release(b)

    first = asyncio.ensure_future(one("first"))
    await asyncio.sleep(0)
    group.speed.token_s *= 0.9
    second = asyncio.ensure_future(one("second"))
    await asyncio.sleep(0)
    assert group.queued == 2
    group.release(busy)
    await asyncio.gather(first, second)
    assert served == ["first", "second"]


async def test_a_retried_request_goes_first_in_a_pool_queued_by_cost():
    balancer = one_card("cost")
    group = balancer.groups[0]
    busy = group.take()
    waiting = [asyncio.ensure_future(group.wait(later(5), estimate=estimate({"max_tokens": 1}, 10)))]
    await asyncio.sleep(0)
    retried = asyncio.ensure_future(group.wait(later(5), front=True))
    await asyncio.sleep(0)
    group.release(busy)
    assert (await retried) is balancer.backends[0]
    assert not waiting[0].done()
    group.release(balancer.backends[0])
    await waiting[0]


async def test_a_pools_reserved_slot_waits_for_a_cheap_request():
    """A card of 3 slots, 1 reserved: two dear requests take the two others; a third dear one waits with a slot
    free, a cheap one takes that slot at once; when a slot frees the dear one gets it, and the reserved one stays
    free after the cheap one leaves. The status shows the reserve."""
    balancer = one_card("cost", cap=3, reserve=1)
    group = balancer.groups[0]
    card = balancer.backends[0]
    assert group.take() is card and group.take() is card  # while more than 1 is free: no estimate needed
    assert group.take() is None  # the last free slot is the reserved one: the cost decides
    dear = asyncio.ensure_future(group.wait(later(5), estimate=estimate({"max_tokens": 4000}, 100)))
    await asyncio.sleep(0)
    assert not dear.done() and group.queued == 1 and card.active == 2
    cheap = await group.wait(later(5), estimate=estimate({"max_tokens": 8}, 100))  # handed the slot at once
    assert cheap is card and card.active == 3 and not dear.done()
    assert group.status()["queue_reserve"] == 1
    group.release(card)  # one of the dear ones ends: 1 free, the reserved one
    await asyncio.sleep(0)
    assert not dear.done()
    group.release(card)  # the cheap one ends: 2 free, the dear one may take one
    assert (await dear) is card and card.active == 2 and group.queued == 0
    assert one_card("fifo", reserve=1).groups[0].reserve == 0  # FIFO estimates no cost: no reserve


# -- over real sockets: a proxy in front of one card --

def test_short_requests_overtake_long_ones_through_the_proxy_and_fifo_keeps_order(start_sim, start_proxy):
    """One card with one slot, busy; a long request queues, then a short one. Queued by cost the short one is
    answered first; with queue_policy fifo it waits for the long one. The results log keeps each queue time."""
    sim = start_sim(*slow(itl_ms=20, tokens=400))
    for policy in ("cost", "fifo"):
        proxy = start_proxy([sim.url], healthy=1, backend_concurrency=1, queue_policy=policy)
        finished: list[str] = []

        def send(name: str, max_tokens: int, proxy=proxy, finished=finished):
            r = proxy.chat(body(user=name, max_tokens=max_tokens))
            assert r.status_code == 200, r.text
            finished.append(name)

        def queued(proxy=proxy) -> int:
            return proxy.lb_status()["queue"]

        with ThreadPoolExecutor(3) as pool:
            busy = pool.submit(send, "busy", 15)  # ~0.3 s on the card
            wait_until(lambda proxy=proxy: proxy.lb_status()["backends"][0]["active"] == 1, 10, what="card busy")
            long = pool.submit(send, "long", 30)
            wait_until(lambda: queued() == 1, 10, what="long queued")
            short = pool.submit(send, "short", 2)
            wait_until(lambda: queued() == 2, 10, what="short queued")
            for f in (busy, long, short):
                f.result()
        expected = ["busy", "short", "long"] if policy == "cost" else ["busy", "long", "short"]
        assert finished == expected, policy
        lines = {line["orid"]: line for line in proxy.settled_results("short") + proxy.settled_results("long")}
        assert lines["short"]["queue_ms"] > 100 and lines["long"]["queue_ms"] > 100
        assert proxy.lb_status()["models"][next(iter(proxy.lb_status()["models"]))]["queue_policy"] == policy
        proxy.stop()
