"""Serving hosts whose dcu-proxy refused the gateway's connection, left out of routing for a while (hooks.py).

LiteLLM 1.106 reports a refused connection as a 500 (InternalServerError, "Connection error."), which its retry
policy cannot tell from a 500 after generated tokens, so it is neither retried nor counted apart: each caller
meets it until `allowed_fails` + 1 failures cool the host down. The cause chain does tell: a connect that failed
(ConnectionRefusedError under aiohttp's ClientConnectorError or httpx's ConnectError) sent nothing, so the
host's proxy is not listening. The hook marks such a host at its first refused connection and leaves it out for
`hold` seconds (DCU_GATEWAY_UNREACHABLE_HOLD, the role sets the cooldown); a request after that tries it again.
One failed request per host outage and hold, per worker, instead of allowed_fails + 1.
"""

from __future__ import annotations

import logging
import os
import time

HOLD_ENV = "DCU_GATEWAY_UNREACHABLE_HOLD"
DEFAULT_HOLD = 30.0
# By name, so that this module needs neither aiohttp nor httpx (LiteLLM's transports: either may raise).
_CONNECT_FAILED = {"ConnectionRefusedError", "ClientConnectorError", "ConnectError"}

log = logging.getLogger("dcu_serving.gateway")


def connect_failed(exc: BaseException | None) -> bool:
    """True when the exception, or one it came from, is a connection that was never made (nothing was sent)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if any(cls.__name__ in _CONNECT_FAILED for cls in type(exc).__mro__):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


class Unreachable:
    """Hosts marked unreachable until `hold` seconds after their last refused connection."""

    def __init__(self, hold: float | None = None, clock=time.monotonic):
        self.hold = float(os.environ.get(HOLD_ENV) or DEFAULT_HOLD) if hold is None else hold
        self.clock = clock
        self._until: dict[str, float] = {}

    def mark(self, host: str) -> None:
        now = self.clock()
        if self._until.get(host, 0.0) <= now:
            log.warning("%s refused the connection: left out of routing for %.0f s", host, self.hold)
        self._until[host] = now + self.hold

    def hosts(self) -> frozenset:
        now = self.clock()
        return frozenset(host for host, until in self._until.items() if until > now)
