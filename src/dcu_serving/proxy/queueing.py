"""Who gets a pool's next free slot: its queue's order, what a waiting request is expected to cost, and what the
proxy learns of its model's speed.

Two orders (`queue_policy`):

  fifo  first come, first served.
  cost  the cheapest expected work first (shortest job first), with an aging bound: a request is never handed a
        slot later than `queue_aging` times its place in line would have had it under FIFO, counted in slots handed
        out. On arrival a request behind N others may be overtaken by at most floor((aging - 1) * (N + 1)) later
        arrivals (its `slack`); a request whose slack is spent is overtaken by no one, and nothing behind it goes
        first. Equal costs keep arrival order: with one kind of request it is FIFO. Costs are compared in powers of
        two (`order_cost`): estimates are rough, and the speed they are made with moves with every answer, so two
        requests alike would otherwise overtake each other by noise; within a factor of two arrival order decides.

With `cost`, `queue_reserve` keeps the last N free slots of a pool for cheap requests (expected to cost at most
`CHEAP_S` on a card, the cheapest cost class): a dearer request takes a slot only while more than N are free. A
cheap request then seldom waits for the next slot to free, as it would with every slot taken; the price is that
a reserved slot may stand empty while dear requests wait (the cards do less work). A reserved slot handed to a
cheap request overtakes the waiters ahead as any other, and the reserve holds back no request whose slack is spent:
the aging bound holds over every slot, so a flood of cheap requests cannot starve a dear one.

The decision is `pick`, a pure function of the waiters in arrival order (tests/proxy/test_queueing.py). It runs
only while requests wait: a request that finds a slot free never reaches this module, nor does its cost get
estimated.

A cost is expected seconds on a card: prefill (prompt tokens, images) plus decode (the tokens it may generate:
`max_tokens`, else what this pool's uncapped requests generated on average, thinking on and off apart), at the
speed this pool's answers showed (`Speed`, learned from the requests that waited). Other APIs (embeddings,
rerank, uploads) cost in proportion to their body's size.
"""

from __future__ import annotations

import math

# Cost classes for the metrics and /__lb_status: upper bounds in expected seconds on a card.
COST_CLASSES = ((1.0, "0-1s"), (10.0, "1-10s"), (60.0, "10-60s"), (math.inf, "60s+"))
IMAGE_TOKENS = 1024  # prompt tokens an image is taken to cost before the answers tell (vision models: 64-2,560)
BYTES_PER_TOKEN = 4  # a prompt's text, roughly, in any language the tokenizers here see
LEARNING_RATE = 0.1  # weight of each answer in the moving averages of `Speed`
CHEAP_S = COST_CLASSES[0][0]  # a request whose order_cost is at most this (an estimate up to 1.41 s) may take a
#                               reserved slot (queue_reserve)


class Waiter:
    """A request waiting in a pool's queue: the future its slot arrives on, and what the order needs."""

    __slots__ = ("cost", "estimate", "future", "slack")

    def __init__(self, future, cost: float, slack: float, estimate: Estimate | None = None):
        self.future = future
        self.cost = cost
        self.slack = slack  # later arrivals that may still go first
        self.estimate = estimate


def order_cost(seconds: float) -> float:
    """The cost the order compares: the estimate in seconds rounded to a power of two (0 and less kept)."""
    if seconds <= 0:
        return seconds
    return 2.0 ** round(math.log2(seconds))


def slack(aging: float, ahead: int) -> float:
    """How many later arrivals may go ahead of a request that found `ahead` others waiting."""
    if math.isinf(aging):
        return math.inf
    return math.floor((aging - 1.0) * (ahead + 1))


def pick(waiters, free: float = math.inf, reserve: int = 0, cheap: float = CHEAP_S) -> int:
    """The index (in arrival order) of the waiter to hand the next slot: the cheapest, the first of equal costs,
    but none behind a waiter whose slack is spent.

    `free`: the pool's free slots, the one on offer included. When `free` <= `reserve` the slot is a reserved one
    (queue_reserve): it goes to that waiter if it costs at most `cheap` or a waiter in reach has spent its slack
    (it is due: the reserve does not hold it back); else to none (-1), and the slot stays free."""
    first = waiters[0]
    if first.slack <= 0:
        return 0
    best, best_cost, due = 0, first.cost, False
    for i in range(1, len(waiters)):
        w = waiters[i]
        if w.cost < best_cost:
            best, best_cost = i, w.cost
        if w.slack <= 0:
            due = True
            break
    if free > reserve or best_cost <= cheap or due:
        return best
    return -1


def overtake(waiters, chosen: int):
    """The waiters ahead of the chosen one were overtaken once more."""
    for i in range(chosen):
        waiters[i].slack -= 1


def cost_class(seconds: float) -> str:
    for bound, name in COST_CLASSES:
        if seconds <= bound:
            return name
    return COST_CLASSES[-1][1]


class Estimate:
    """What a request says of its cost: prompt tokens (estimated), the tokens it may generate (None: not capped,
    the pool's learned mean applies), whether thinking is on (None: the model's default). A request that
    generates nothing (embeddings, rerank, an upload) is known by its `size` in bytes alone (`prompt` None)."""

    __slots__ = ("output", "prompt", "size", "thinking")

    def __init__(self, prompt: float | None = None, output: int | None = None, thinking: bool | None = None,
                 size: int = 0):
        self.prompt = prompt
        self.output = output
        self.thinking = thinking
        self.size = size


def estimate(payload: dict | None, size: int) -> Estimate:
    """What a chat or completions request says it may cost (`payload`, its parsed body of `size` bytes); any
    other request (payload None) is known by its size."""
    if payload is None:
        return Estimate(size=size)
    cap = payload.get("max_completion_tokens") or payload.get("max_tokens")
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        cap = None
    kwargs = payload.get("chat_template_kwargs")
    thinking = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
    images, inline = 0, 0
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, list):
                continue
            for part in content:
                if not isinstance(part, dict):
                    continue
                for key in ("image_url", "video_url", "audio_url", "input_audio"):
                    media = part.get(key)
                    if media is None:
                        continue
                    images += 1
                    url = media.get("url") or media.get("data") if isinstance(media, dict) else media
                    if isinstance(url, str):
                        inline += len(url)
    prompt = max(size - inline, 0) / BYTES_PER_TOKEN + images * IMAGE_TOKENS
    return Estimate(prompt, cap, thinking if isinstance(thinking, bool) else None, size)


class Speed:
    """What a pool's answers showed of its model: seconds per generated token and per prompt token, seconds per
    byte of a request that generates nothing, and the tokens an uncapped request generates (thinking on, off,
    or the model's default). Moving averages, updated from the requests that waited (they are the ones ordered)."""

    __slots__ = ("byte_s", "output", "prompt_s", "token_s")

    def __init__(self):
        self.token_s = 0.03  # a DCU card's decode step for a mid-sized model, until answers tell
        self.prompt_s = 0.0005
        self.byte_s = 1e-6
        self.output = {None: 1024.0, False: 512.0, True: 2048.0}

    def seconds(self, e: Estimate) -> float:
        """The expected seconds on a card of the request `e` describes."""
        if e.prompt is None:
            return e.size * self.byte_s
        output = e.output if e.output is not None else self.output[e.thinking]
        return e.prompt * self.prompt_s + output * self.token_s

    def learn(self, e: Estimate, rec: dict, elapsed: float):
        """Take in a finished request's record (results-log fields) and its time from arrival to the end."""
        if rec["status"] != 200 or rec["queue_ms"] is None:
            return
        service = elapsed - rec["queue_ms"] / 1000
        tokens = rec["completion_tokens"]
        rate = LEARNING_RATE
        if e.prompt is None:
            if e.size:
                self.byte_s += rate * (service / e.size - self.byte_s)
            return
        if tokens is None:
            return
        if e.output is None:
            self.output[e.thinking] += rate * (tokens - self.output[e.thinking])
        ttft = rec["ttft_ms"]
        prompt = rec["prompt_tokens"] or e.prompt
        if ttft is not None and tokens > 1:  # a stream: prefill and decode apart
            first = (ttft - rec["queue_ms"]) / 1000
            if prompt:
                self.prompt_s += rate * (max(first, 0.0) / prompt - self.prompt_s)
            self.token_s += rate * (max(service - first, 0.0) / (tokens - 1) - self.token_s)
        elif tokens:
            decode = max(service - prompt * self.prompt_s, 0.0)
            self.token_s += rate * (decode / tokens - self.token_s)

    def status(self) -> dict:
        return {"token_ms": round(self.token_s * 1000, 3), "prompt_ms_per_1k_tokens": round(self.prompt_s * 1e6, 1),
                "uncapped_output_tokens": {"thinking": round(self.output[True]),
                                           "no_thinking": round(self.output[False]),
                                           "default": round(self.output[None])}}
