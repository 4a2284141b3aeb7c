"""What every part of the proxy puts on the answers it makes itself: the request id, `X-Backend: dcu-proxy`,
and errors in vLLM's envelope."""

from __future__ import annotations

import itertools
import os

from aiohttp import web

from .errors import ProxyError, envelope_bytes

SELF = "dcu-proxy"  # the X-Backend value of responses the proxy makes itself
MAX_REQUEST_ID = 128

_REQUEST_ID_PREFIX = os.urandom(8).hex()  # per process, so ids stay unique across restarts and proxies
_request_numbers = itertools.count()


def request_id(request: web.BaseRequest) -> str:
    """The caller's X-Request-Id if it is usable (printable ASCII, at most 128 characters), else a new one."""
    rid = request.headers.get("X-Request-Id")
    if not rid or len(rid) > MAX_REQUEST_ID or not (rid.isascii() and rid.isprintable()):
        return new_request_id()
    return rid


def new_request_id() -> str:
    """32 hex digits, like uuid4().hex, without a getrandom() syscall per request."""
    return f"{_REQUEST_ID_PREFIX}{next(_request_numbers):016x}"


def own_headers(request: web.BaseRequest) -> dict:
    """Headers of an answer the proxy makes itself."""
    return {"X-Backend": SELF, "X-Request-Id": request_id(request)}


def error_response(e: ProxyError, rid: str, backend_name: str = SELF) -> web.Response:
    """`e` as vLLM's error envelope; `backend_name` is the card it concerns, if any."""
    headers = {"Content-Type": "application/json", "X-Backend": backend_name, "X-Request-Id": rid}
    if e.headers:
        headers.update(e.headers)
    return web.Response(body=envelope_bytes(e.status, e.message, e.param), status=e.status, headers=headers)
