"""The standard client: the service contract compiled into code.

    from dcu_serving.client import recognize, recognize_stream, check_service, strip_thinking

    ok, healthy, ids = check_service()                       # True, "8/8", ["127.0.0.1:8002", ...]
    r = recognize("test.jpg", prompt="图里有几个人？", orid="ORD-123")
    r.answer, r.finish_reason, r.backend, r.truncated       # or read-only keys: r["answer"], r["backend"]
    for piece in recognize_stream("test.jpg", orid="ORD-125"):
        print(piece, end="", flush=True)

Needs only `requests` and Pillow: `pip install 'dcu-serving[client]'`. The base URL defaults from
DCU_SERVING_URL.
"""

from .api import Client, Result, Retry, Stream, check_service, recognize, recognize_stream
from .errors import (
    BackendError,
    BadRequestError,
    RetryableError,
    ServiceError,
    ServiceTimeout,
    ServiceUnavailable,
    TruncatedError,
    UnsupportedImageError,
)
from .images import sniff_mime, to_data_uri
from .thinking import split_thinking, strip_thinking

__all__ = [
    "BackendError", "BadRequestError", "Client", "Result", "Retry", "RetryableError", "ServiceError",
    "ServiceTimeout", "ServiceUnavailable", "Stream", "TruncatedError", "UnsupportedImageError",
    "check_service", "recognize", "recognize_stream", "sniff_mime", "split_thinking", "strip_thinking",
    "to_data_uri",
]
