"""Caller keys for LiteLLM's `general_settings.custom_auth`, read from a file instead of a database.

The keys file (DCU_GATEWAY_KEYS, JSON; roles/dcu_gateway writes it 0600 for the service user) holds no key in
clear, only each key's SHA-256:

    {"callers": [{"alias": "billing", "sha256": "<hex>", "rpm": 600, "concurrent": 8, "probe": false}, ...]}

A known key becomes a UserAPIKeyAuth with its alias and limits: LiteLLM's parallel request limiter (in memory
without Redis) answers 429 past `rpm` requests a minute or `concurrent` requests in flight. Anything else is a 401.
A caller's key reaches the inference paths only (paths.py); `/health` and the rest take a probe key (`probe: true`),
else a 403.
The file is read again when it changes (a rotation needs no restart).
"""

from __future__ import annotations

import hashlib
import json
import os

from fastapi import Request
from litellm.proxy._types import ProxyErrorTypes, ProxyException, UserAPIKeyAuth

from . import paths

ENV = "DCU_GATEWAY_KEYS"
_cache: dict = {"stamp": None, "callers": {}}


def load(path: str) -> dict[str, dict]:
    """The callers of a keys file by key digest; a mistake names the entry and the fix."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    callers = {}
    for i, c in enumerate(doc.get("callers") or []):
        digest, alias = str(c.get("sha256", "")).lower(), c.get("alias")
        if len(digest) != 64 or not alias:
            raise ValueError(f"{path}: callers[{i}] needs `alias` and `sha256` (the key's SHA-256, 64 hex digits)")
        callers[digest] = {"alias": str(alias), "rpm": c.get("rpm"), "concurrent": c.get("concurrent"),
                           "probe": c.get("probe") is True}
    return callers


def callers() -> dict[str, dict]:
    path = os.environ.get(ENV)
    if not path:
        raise RuntimeError(f"{ENV} is not set: the gateway has no caller keys (roles/dcu_gateway sets it)")
    st = os.stat(path)
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    if stamp != _cache["stamp"]:
        _cache["callers"], _cache["stamp"] = load(path), stamp
    return _cache["callers"]


def _refuse() -> ProxyException:
    return ProxyException(message="Authentication error: unknown API key (ask the gateway's operators for one)",
                          type=ProxyErrorTypes.auth_error, param="api_key", code=401)


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    key = api_key.removeprefix("Bearer ").strip() if api_key else ""
    if not key:
        raise _refuse()
    digest = hashlib.sha256(key.encode()).hexdigest()
    # Looked up by digest: how long a lookup takes tells nothing about the keys themselves.
    c = callers().get(digest)
    if c is None:
        raise _refuse()
    if not paths.allowed(request.url.path, c["probe"]):
        raise ProxyException(message=paths.refusal(request.url.path), type=ProxyErrorTypes.auth_error,
                             param="api_key", code=403)
    # api_key is what LiteLLM's limiter counts by: the digest, so the key itself is kept nowhere.
    return UserAPIKeyAuth(api_key=digest, token=digest, key_alias=c["alias"], rpm_limit=c["rpm"],
                          max_parallel_requests=c["concurrent"])
