"""The simulated engine: deterministic text, timing, and vLLM's admission (max-num-seqs + FIFO queue).

Cheap by design: the text of a request is planned once as a list of pieces (tokens), and each
token costs one timer wake-up; the server turns pieces into pre-encoded SSE bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from dcu_serving.sim.config import SimConfig
from dcu_serving.sim.faults import EngineError, Faults, crash_process

THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n\n"

_THINK_TEXT = (
    "let me look at the image carefully first the user wants the text so I should read every line "
    "there is a title at the top and a table below it I need to check the numbers again maybe the "
    "second column is a date wait that looks like a stamp so I will keep the order from top to bottom"
)
_ANSWER_TEXT = (
    "the document shows an invoice issued to the customer with a total amount of three hundred yuan "
    "the date is printed in the upper right corner and the seal is red each row lists an item its "
    "quantity and price the signature at the bottom is readable and the form number is complete"
)
_THINK_WORDS, _ANSWER_WORDS = _THINK_TEXT.split(), _ANSWER_TEXT.split()


def _sentences(rng: random.Random, words: tuple[str, ...] | list[str], count: int) -> list[str]:
    """`count` pieces of plausible prose: ' word' tokens, capitalised sentence starts, full stops."""
    pieces: list[str] = []
    start = True
    while len(pieces) < count:
        word = rng.choice(words)
        if start:
            pieces.append((" " if pieces else "") + word.capitalize())
            start = False
        elif rng.random() < 0.09:
            pieces.append(".")
            start = True
        else:
            pieces.append(" " + word)
    if count:
        pieces[-1] = "."
    return pieces


@dataclass(eq=False)  # compared and hashed by identity: the engine keeps a set of them
class Sequence:
    """One request inside the engine."""

    request_id: str
    prompt_tokens: int
    images: int
    pieces: list[str]           # the completion, already cut to max_tokens
    finish_reason: str          # "stop", or "length" when max_tokens cut it
    thinking_pieces: int        # leading pieces that belong to the <think> block (tags included)
    rng: random.Random
    arrival: float = field(default_factory=time.monotonic)
    generated: int = 0
    encoder_tokens: int = 0     # audio frames an encoder reads before the first token (Whisper: 1500 per 30 s)

    @classmethod
    def pooling(cls, request_id: str, prompt_tokens: int) -> Sequence:
        """A pooling request (an embedding, a score): a prefill and no generated token."""
        return cls(request_id, prompt_tokens, 0, [], "stop", 0, random.Random(0))


def plan(config: SimConfig, key: dict, prompt_tokens: int, images: int, thinking: bool,
         max_tokens: int, request_id: str) -> Sequence:
    """The completion of a request: a pure function of the request (`key`) and --sim-seed."""
    digest = hashlib.sha256(json.dumps([config.seed, key], sort_keys=True, default=str).encode()).digest()
    rng = random.Random(digest)
    pieces: list[str] = []
    if thinking:
        think = round(config.think_tokens * rng.uniform(0.85, 1.15))
        pieces += [THINK_OPEN, *_sentences(rng, _THINK_WORDS, think), THINK_CLOSE]
    thinking_pieces = len(pieces)
    pieces += _sentences(rng, _ANSWER_WORDS, max(1, round(config.answer_tokens * rng.uniform(0.7, 1.3))))
    finish = "length" if len(pieces) > max_tokens else "stop"
    return Sequence(request_id, prompt_tokens, images, pieces[:max_tokens], finish,
                    min(thinking_pieces, max_tokens), rng)


class Scheduler:
    """At most `limit` sequences run; the others wait in arrival order (like vLLM's waiting queue)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.running = 0
        self.waiting: deque[asyncio.Future] = deque()

    async def acquire(self):
        if self.running < self.limit and not self.waiting:
            self.running += 1
            return
        ticket = asyncio.get_running_loop().create_future()
        self.waiting.append(ticket)
        try:
            await ticket
        except asyncio.CancelledError:
            if ticket.done() and not ticket.cancelled():
                self.release()  # the slot arrived as the client left: pass it on
            else:
                self.waiting.remove(ticket)
            raise

    def release(self):
        while self.waiting:
            ticket = self.waiting.popleft()
            if not ticket.done():
                ticket.set_result(None)  # the slot goes straight to the next in line
                return
        self.running -= 1


class Engine:
    def __init__(self, config: SimConfig, faults: Faults, metrics):
        self.config = config
        self.faults = faults
        self.metrics = metrics
        self.scheduler = Scheduler(config.max_num_seqs)
        self.active: set[Sequence] = set()

    @property
    def kv_cache_usage(self) -> float:
        used = sum(s.prompt_tokens + s.generated for s in self.active)
        return used / (self.config.max_num_seqs * self.config.max_model_len)

    def time_to_first_token(self, seq: Sequence) -> float:
        c = self.config
        prefill = (seq.prompt_tokens + seq.encoder_tokens) / c.prefill_speed * 1000
        ms = c.ttft_ms + prefill + seq.images * c.image_ms
        return ms / 1000 * self.faults.slow_factor

    async def pool(self, seq: Sequence):
        """Run a pooling request: queued like any other, done when its prompt is prefilled."""
        async with self.run(seq) as timer:
            await timer.prefilled()

    @asynccontextmanager
    async def run(self, seq: Sequence):
        """Queue, hold a slot while the body runs, and account for the outcome in the metrics."""
        m = self.metrics
        finish = "abort"
        try:
            await self.scheduler.acquire()
        except asyncio.CancelledError:
            m.finished(finish, time.monotonic() - seq.arrival)  # the client left while queued
            raise
        try:
            self.active.add(seq)
            m.queue_time.observe(time.monotonic() - seq.arrival)
            yield Timer(self, seq)
            finish = seq.finish_reason
        finally:
            self.active.discard(seq)
            self.scheduler.release()
            m.finished(finish, time.monotonic() - seq.arrival)


class Timer:
    """Paces one sequence: the first token after the TTFT, then one every ITL (± jitter)."""

    def __init__(self, engine: Engine, seq: Sequence):
        self.engine, self.seq = engine, seq
        self.loop = asyncio.get_running_loop()
        self.due = self.loop.time() + engine.time_to_first_token(seq)
        self.last = 0.0

    async def prefilled(self):
        delay = self.due - self.loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        self.engine.metrics.prefilled(self.seq.prompt_tokens, time.monotonic() - self.seq.arrival)

    async def next_token(self):
        engine, seq = self.engine, self.seq
        delay = self.due - self.loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        now = self.loop.time()
        faults = engine.faults
        if faults.crash_after_tokens is not None and seq.generated >= faults.crash_after_tokens:
            crash_process(f"fault crash_mid_stream: exiting after {seq.generated} tokens of {seq.request_id}")
        if faults.error_after_tokens is not None and seq.generated >= faults.error_after_tokens:
            raise EngineError(f"Simulated generation failure after {seq.generated} tokens "
                              "(dcu-vllm-sim fault 'error_mid_stream').")
        seq.generated += 1
        m = engine.metrics
        if seq.generated == 1:
            m.first_token(seq.prompt_tokens, time.monotonic() - seq.arrival)
        else:
            m.token(now - self.last)
        self.last = now
        c = engine.config
        gap = c.token_ms / 1000 * (1 + c.itl_jitter * (2 * seq.rng.random() - 1)) * engine.faults.slow_factor
        # Keep the schedule (so the mean gap stays as configured) unless we fell a whole gap behind.
        self.due = max(self.due + gap, now)
