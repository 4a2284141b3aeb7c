"""The gateway's hooks, loaded by LiteLLM from `litellm_settings.callbacks: [dcu_serving.gateway.hooks.caller_header]`.

- The caller's alias on every request to a host: the `X-Caller` header dcu-proxy writes into its results log.
  Whatever the caller put under that name itself (a body's `extra_headers`) is replaced: only the gateway names
  callers.
- Drained hosts are left out of routing (drained.py): a play changing a host takes it out of rotation first.
- A host whose dcu-proxy refused a connection is left out for a while (unreachable.py): one failed request per
  outage, not allowed_fails + 1.
"""

from __future__ import annotations

from litellm.integrations.custom_logger import CustomLogger

from .drained import Drained, host_of, without
from .unreachable import Unreachable, connect_failed

HEADER = "X-Caller"


class CallerHeader(CustomLogger):
    def __init__(self, drained: Drained | None = None, unreachable: Unreachable | None = None):
        super().__init__()
        self.drained = drained or Drained()
        self.unreachable = unreachable or Unreachable()

    async def async_filter_deployments(self, model, healthy_deployments, messages, request_kwargs=None,
                                       parent_otel_span=None):
        return without(healthy_deployments, self.drained.hosts() | self.unreachable.hosts())

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        if connect_failed(kwargs.get("exception")):
            host = host_of({"model_info": (kwargs.get("litellm_params") or {}).get("model_info")})
            if host:
                self.unreachable.mark(host)

    async def async_pre_call_hook(self, user_api_key_dict, cache, data: dict, call_type):
        headers = {k: v for k, v in (data.get("extra_headers") or {}).items() if k.lower() != HEADER.lower()}
        alias = user_api_key_dict.key_alias
        if alias:
            headers[HEADER] = alias
        data["extra_headers"] = headers
        return data


caller_header = CallerHeader()
