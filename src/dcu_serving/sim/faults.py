"""Fault injection: what can go wrong with a vLLM backend, switched on at start or at run time.

A fault is a kind plus parameters. On the command line and in DCU_SIM_FAULT it is written
`KIND[:key=value]...` (several separated by commas), e.g. `slow:factor=4,unhealthy`;
over HTTP (`POST /__sim/fault`) it is a JSON object `{"kind": "slow", "factor": 4}`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field

# kind -> {parameter: (type, default)}; the docstring of each kind is what `--help` prints.
KINDS: dict[str, dict[str, tuple[type, object]]] = {
    "crash": {"after_s": (float, 0.0)},             # the process exits (code 1) after_s seconds from now
    "hang": {},                                     # accepts connections, never answers (except /__sim)
    "error": {"status": (int, 500), "every": (int, 1)},  # every `every`-th completion fails with this status
    "slow": {"factor": (float, 5.0)},               # time to first token and inter-token latency × factor
    "unhealthy": {},                                # /health and /ping answer 503, like a dead engine
    "fail_first": {"count": (int, 1), "status": (int, 500)},  # the next `count` completions fail
    "crash_mid_stream": {"after_tokens": (int, 5)},  # the process exits once a sequence has that many tokens
    "error_mid_stream": {"after_tokens": (int, 5)},  # generation fails after that many tokens (200 + error event)
}

HELP = (
    "crash[:after_s=S] | hang | error[:status=500:every=1] | slow[:factor=5] | unhealthy | "
    "fail_first[:count=1:status=500] | crash_mid_stream[:after_tokens=5] | error_mid_stream[:after_tokens=5]"
)


log = logging.getLogger("dcu_serving.sim")


def crash_process(reason: str):
    """Exit at once like a crashed engine: no cleanup, open connections drop. Logs are flushed first."""
    log.error("simulated crash: %s", reason)
    logging.shutdown()
    os._exit(1)


class EngineError(RuntimeError):
    """A simulated failure inside generation (vLLM's EngineGenerateError)."""


class FaultError(ValueError):
    """A fault description that cannot be used; the message says what to write instead."""


@dataclass(frozen=True)
class Fault:
    kind: str
    params: dict = field(default_factory=dict)

    @classmethod
    def build(cls, kind: str, raw: dict) -> Fault:
        if kind not in KINDS:
            raise FaultError(f"unknown fault kind {kind!r}; use one of: {', '.join(KINDS)}")
        spec = KINDS[kind]
        unknown = set(raw) - set(spec)
        if unknown:
            allowed = ", ".join(spec) or "no parameters"
            raise FaultError(f"fault {kind!r} does not take {', '.join(sorted(unknown))} (it takes {allowed})")
        params = {}
        for name, (kind_type, default) in spec.items():
            value = raw.get(name, default)
            try:
                value = kind_type(value)
            except (TypeError, ValueError):
                raise FaultError(f"fault {kind!r}: {name} must be a {kind_type.__name__}, got {value!r}") from None
            if value < 0 or (name in ("factor", "count", "every") and value == 0):
                raise FaultError(f"fault {kind!r}: {name} must be positive, got {value!r}")
            params[name] = value
        if "status" in params and not 400 <= params["status"] <= 599:
            raise FaultError(f"fault {kind!r}: status must be an HTTP error status (400-599)")
        return cls(kind, params)

    @classmethod
    def parse(cls, text: str) -> Fault:
        """`slow:factor=4` -> Fault("slow", {"factor": 4.0})"""
        kind, *pairs = text.strip().split(":")
        raw = {}
        for pair in pairs:
            name, sep, value = pair.partition("=")
            if not sep:
                raise FaultError(f"fault {text!r}: write parameters as name=value, e.g. slow:factor=4")
            raw[name.strip()] = value.strip()
        return cls.build(kind.strip(), raw)

    @classmethod
    def from_json(cls, body) -> Fault:
        if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
            raise FaultError('send a JSON object with a "kind", e.g. {"kind": "slow", "factor": 4}')
        raw = {k: v for k, v in body.items() if k != "kind"}
        return cls.build(body["kind"], raw)


def parse_fault_list(text: str) -> list[Fault]:
    """`slow:factor=4,unhealthy` -> two faults (an empty string -> none)."""
    return [Fault.parse(item) for item in text.split(",") if item.strip()]


class Faults:
    """The faults active in one simulator process, at most one per kind."""

    def __init__(self):
        self.active: dict[str, Fault] = {}
        self._not_hanging = asyncio.Event()
        self._not_hanging.set()
        self._completions = 0  # since the `error` fault was set: its `every`-th fails

    def set(self, fault: Fault):
        self.active[fault.kind] = fault
        if fault.kind == "error":
            self._completions = 0
        self._sync_hang()

    def clear(self, kind: str | None = None):
        if kind is None:
            self.active.clear()
        else:
            self.active.pop(kind, None)
        self._sync_hang()

    def _sync_hang(self):
        if "hang" in self.active:
            self._not_hanging.clear()
        else:
            self._not_hanging.set()

    def describe(self) -> list[dict]:
        return [{"kind": f.kind, **f.params} for f in self.active.values()]

    async def wait_while_hanging(self):
        await self._not_hanging.wait()

    @property
    def hanging(self) -> bool:
        return not self._not_hanging.is_set()

    @property
    def unhealthy(self) -> bool:
        return "unhealthy" in self.active

    @property
    def slow_factor(self) -> float:
        fault = self.active.get("slow")
        return fault.params["factor"] if fault else 1.0

    @property
    def crash_after_tokens(self) -> int | None:
        fault = self.active.get("crash_mid_stream")
        return fault.params["after_tokens"] if fault else None

    @property
    def error_after_tokens(self) -> int | None:
        fault = self.active.get("error_mid_stream")
        return fault.params["after_tokens"] if fault else None

    def take_error_status(self) -> tuple[int, str] | None:
        """The status a new completion must fail with (and which fault says so), or None."""
        fault = self.active.get("error")
        if fault:
            self._completions += 1
            if self._completions % fault.params["every"] == 0:
                return fault.params["status"], "error"
        fault = self.active.get("fail_first")
        if fault:
            left = fault.params["count"] - 1
            if left > 0:
                self.active["fail_first"] = Fault("fail_first", {**fault.params, "count": left})
            else:
                del self.active["fail_first"]
            return fault.params["status"], "fail_first"
        return None
