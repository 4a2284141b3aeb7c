"""What can go wrong when calling the service, split by what the caller should do about it.

    ServiceError
    ├── BadRequestError          4xx: the request is wrong; fix it, never retry
    ├── RetryableError           the same request may succeed on a later try
    │   ├── BackendError         502: a card's connection broke; the proxy already ejected it
    │   └── ServiceUnavailable   503 / connection refused: no healthy backend or queue full
    ├── ServiceTimeout           504 or the client's own timeout: lower max_tokens or turn thinking off
    └── TruncatedError           finish_reason == "length" when the caller asked for strictness
"""

from __future__ import annotations

import json


class ServiceError(Exception):
    """An error from the service, with the fields its error envelope carried."""

    retryable = False

    def __init__(self, message: str, *, status: int | None = None, type: str | None = None,
                 param: str | None = None, request_id: str | None = None, backend: str | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.request_id = request_id
        self.backend = backend
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = ", ".join(
            f"{k}={v}" for k, v in (("status", self.status), ("request_id", self.request_id),
                                    ("backend", self.backend)) if v is not None
        )
        return f"{self.message} ({where})" if where else self.message

    def to_dict(self) -> dict:
        return {"error": type(self).__name__, "message": self.message, "status": self.status,
                "type": self.type, "param": self.param, "request_id": self.request_id,
                "backend": self.backend, "retry_after": self.retry_after}


class BadRequestError(ServiceError):
    """The request breaks the contract (400/404/413/422): read `message`, fix it, do not retry."""


class RetryableError(ServiceError):
    retryable = True


class BackendError(RetryableError):
    """502: the connection to a card broke; the proxy has ejected it, so a retry lands elsewhere."""


class ServiceUnavailable(RetryableError):
    """503 (no healthy backend, queue full) or the proxy cannot be reached: retry later."""


class ServiceTimeout(ServiceError):
    """504 (over the proxy deadline) or the client's timeout: lower max_tokens or disable thinking."""


class TruncatedError(ServiceError):
    """The answer hit max_tokens (finish_reason "length"); raised only when strict=True."""

    def __init__(self, message: str, result=None, **kw):
        super().__init__(message, **kw)
        self.result = result


class UnsupportedImageError(ValueError):
    """The image is not JPEG, PNG, GIF, WebP, BMP or TIFF; raised before anything is sent."""


def _envelope(body: bytes | str | dict | None) -> dict:
    """The error object from vLLM's envelope ({"error": {...}}) or its older flat form."""
    if isinstance(body, (bytes, str)):
        try:
            body = json.loads(body)
        except ValueError:
            text = body.decode(errors="replace") if isinstance(body, bytes) else body
            return {"message": text.strip()[:500] or None}
    if not isinstance(body, dict):
        return {}
    inner = body.get("error")
    if isinstance(inner, dict):
        return inner
    if isinstance(inner, str):
        return {"message": inner}
    return body  # flat: {"object": "error", "message": ..., "type": ..., "code": ...}


def error_from_response(status: int, body, headers=None) -> ServiceError:
    """Map an HTTP error (or an in-stream error event) to the exception the caller acts on."""
    headers = headers or {}
    err = _envelope(body)
    code = err.get("code")
    if isinstance(code, int) and status == 200:  # an error event inside a 200 stream
        status = code
    message = err.get("message") or f"HTTP {status}"
    retry_after = headers.get("Retry-After")
    try:
        retry_after = float(retry_after) if retry_after is not None else None
    except ValueError:
        retry_after = None
    kw = dict(status=status, type=err.get("type"), param=err.get("param"),
              request_id=headers.get("X-Request-Id"), backend=headers.get("X-Backend"),
              retry_after=retry_after)
    if status == 502:
        return BackendError(message, **kw)
    if status == 503:
        return ServiceUnavailable(message, **kw)
    if status == 504:
        return ServiceTimeout(message, **kw)
    if 400 <= status < 500:
        return BadRequestError(message, **kw)
    return ServiceError(message, **kw)
