"""The caller's alias on every request to a host: the `X-Caller` header dcu-proxy writes into its results log.

Loaded by LiteLLM from `litellm_settings.callbacks: [dcu_serving.gateway.hooks.caller_header]`. Whatever the
caller put under that name itself (a body's `extra_headers`) is replaced: only the gateway names callers.
"""

from __future__ import annotations

from litellm.integrations.custom_logger import CustomLogger

HEADER = "X-Caller"


class CallerHeader(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict, cache, data: dict, call_type):
        headers = {k: v for k, v in (data.get("extra_headers") or {}).items() if k.lower() != HEADER.lower()}
        alias = user_api_key_dict.key_alias
        if alias:
            headers[HEADER] = alias
        data["extra_headers"] = headers
        return data


caller_header = CallerHeader()
