"""JSON the proxy writes, and answers it reads: orjson, with the standard library as the referee.

Writing each results line and reading each answer with orjson takes a fifth of the standard library's time
(bench/proxy_overhead.py). orjson cannot write lone surrogates or integers beyond 64 bits, and refuses a
few texts the standard library accepts (lone surrogate escapes, NaN); those rare cases take the standard
library's path, with its results and its error messages.

Requests are parsed in contract.parse, which also knows when orjson's reading is not exact enough: it reads
an integer beyond 64 bits as a float, and a caller's order id in `user` can be that long.
"""

from __future__ import annotations

import json

import orjson


def loads(data: bytes):
    """Parse JSON; raises ValueError (json.JSONDecodeError) like json.loads."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(obj) -> bytes:
    """`obj` as compact UTF-8 JSON."""
    try:
        return orjson.dumps(obj)
    except TypeError:  # orjson.JSONEncodeError, e.g. a caller's lone surrogate: written as its \u escape
        return json.dumps(obj, separators=(",", ":")).encode()


def line(obj) -> bytes:
    """`obj` as one line of compact UTF-8 JSON, newline included."""
    return dumps(obj) + b"\n"
