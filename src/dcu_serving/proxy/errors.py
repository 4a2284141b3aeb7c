"""Errors the proxy makes itself, in vLLM's envelope: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import json

# vLLM names its error types after the HTTP status (BadRequestError, NotFoundError, ...).
ERROR_TYPES = {
    400: "BadRequestError",
    401: "UnauthorizedError",
    403: "ForbiddenError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestEntityTooLargeError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


class ProxyError(Exception):
    """A response the proxy answers itself. `headers` adds e.g. Retry-After."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers


def envelope(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "Error"), "param": param,
                      "code": status}}


def envelope_bytes(status: int, message: str, param: str | None = None) -> bytes:
    return json.dumps(envelope(status, message, param), ensure_ascii=False).encode()


def sse_error(status: int, message: str) -> bytes:
    """How vLLM ends a stream that failed after its headers went out: an error event, then [DONE]."""
    return b"data: " + envelope_bytes(status, message) + b"\n\ndata: [DONE]\n\n"
