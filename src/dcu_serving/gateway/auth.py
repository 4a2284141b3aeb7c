"""Caller keys for LiteLLM's `general_settings.custom_auth`, read from a file instead of a database.

The keys file (DCU_GATEWAY_KEYS, JSON; roles/dcu_gateway writes it 0600 for the service user) holds no key in
clear, only each key's SHA-256:

    {"callers": [{"alias": "billing", "sha256": "<hex>", "rpm": 600, "concurrent": 8, "probe": false}, ...]}

A known key becomes a UserAPIKeyAuth with its alias and limits: LiteLLM's parallel request limiter (in memory
without Redis) answers 429 past `rpm` requests a minute or `concurrent` requests in flight. Anything else is a 401.
A caller's key reaches the inference paths only (paths.py); `/health` and the rest take a probe key (`probe: true`),
else a 403.
The file is read again when it changes (a rotation needs no restart).

MinerU's pass-throughs (/mineru/<host>/..., gateway_config's `mineru`) get two more things here, the one place of
LiteLLM's that sees the request and the caller together before a pass-through is sent (LiteLLM 1.106: the caller
hook runs after a pass-through's headers are made, and a pass-through's headers are the config's, fixed):
- the caller's alias as X-Caller, through LiteLLM's own `x-pass-` forwarding (pass_through_endpoints.py forwards an
  `x-pass-<name>` request header as `<name>`): every `x-pass-*` and X-Caller header the caller sent is dropped, and
  `x-pass-x-caller: <alias>` put in - so only the gateway names callers, and a caller cannot set the gateway's other
  headers (X-MinerU-Entrance) either;
- the host's upload limit (DCU_GATEWAY_MINERU_UPLOADS): a larger upload is a 413 naming it, before anything is sent
  to the host. LiteLLM has read the form before auth (spooled to disk past 1 MiB, starlette), and would hold the
  whole file in memory to send it on (make_multipart_http_request reads each part whole): the limit bounds that.
"""

from __future__ import annotations

import hashlib
import json
import os

from fastapi import Request
from litellm.proxy._types import ProxyErrorTypes, ProxyException, UserAPIKeyAuth

from . import paths

ENV = "DCU_GATEWAY_KEYS"
# {gateway path: upload limit in bytes} (gateway_config.MINERU_UPLOADS_ENV; the config's environment_variables)
MINERU_UPLOADS_ENV = "DCU_GATEWAY_MINERU_UPLOADS"
PASS_PREFIX = b"x-pass-"  # LiteLLM's PASS_THROUGH_HEADER_PREFIX
CALLER_HEADER = b"x-caller"
_cache: dict = {"stamp": None, "callers": {}}
_uploads: dict = {"raw": None, "limits": {}}


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
    if paths.mineru(request.url.path):
        await _mineru_upload_within_limit(request)
        _as_caller(request, c["alias"])
    # api_key is what LiteLLM's limiter counts by: the digest, so the key itself is kept nowhere.
    return UserAPIKeyAuth(api_key=digest, token=digest, key_alias=c["alias"], rpm_limit=c["rpm"],
                          max_parallel_requests=c["concurrent"])


def mineru_limits() -> dict[str, int]:
    raw = os.environ.get(MINERU_UPLOADS_ENV) or "{}"
    if raw != _uploads["raw"]:
        _uploads["limits"], _uploads["raw"] = {str(k): int(v) for k, v in json.loads(raw).items()}, raw
    return _uploads["limits"]


async def _mineru_upload_within_limit(request: Request) -> None:
    """A 413 for an upload over its host's limit: its declared length, else the parts LiteLLM has read."""
    path = request.url.path
    limit = next((v for k, v in mineru_limits().items() if path == k or path.startswith(k + "/")), None)
    if limit is None or request.method != "POST":
        return
    size = None
    declared = request.headers.get("content-length")
    if declared and declared.isdigit():
        size = int(declared)
    elif "multipart/form-data" in request.headers.get("content-type", ""):
        form = await request.form()  # read already (LiteLLM's read_request_body): starlette keeps it
        size = sum(len(part.encode()) if isinstance(part, str) else (part.size or 0) for _, part in form.multi_items())
    if size is not None and size > limit:
        raise ProxyException(
            message=f"The upload ({size / 2**20:.1f} MiB) is larger than MinerU's limit of {limit >> 20} MiB on this "
                    f"host (dcu_mineru_max_upload_mb in the inventory): split the document, or raise the limit. "
                    f"Nothing was sent to the host.",
            type=ProxyErrorTypes.bad_request_error, param="files", code=413)


def _as_caller(request: Request, alias: str) -> None:
    """The request's headers without any the caller sent under `x-pass-` or as X-Caller, with the alias to be sent
    as X-Caller (LiteLLM's x-pass- forwarding). Starlette's and LiteLLM's cached copies are made again from it."""
    kept = [(k, v) for k, v in request.scope["headers"]
            if not k.lower().startswith(PASS_PREFIX) and k.lower() != CALLER_HEADER]
    request.scope["headers"] = [*kept, (PASS_PREFIX + CALLER_HEADER, alias.encode("latin-1"))]
    request.__dict__.pop("_headers", None)  # starlette's Request.headers
    if hasattr(request.state, "_cached_headers"):  # LiteLLM's safe_get_request_headers
        del request.state._cached_headers
