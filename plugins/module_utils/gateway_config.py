# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The LiteLLM config of a fleet's gateway, from the inventory's serving hosts (docs/fleet.md).

Shared by the gateway_config filter (roles/dcu_gateway) and dcu_serving.gateway.config (a symlink to this
file). Standard library only: it runs on the controller, under whatever Python runs Ansible.

Every model each host serves becomes a deployment on that host's dcu-proxy; callers name the model, LiteLLM
picks a host. Choices, each for a reason:
- least-busy routing: the deployment with the fewest requests in flight from this gateway, so a host that
  is slow to answer (its queue is long) gets fewer new ones;
- retries only where no work was done: dcu-proxy's 503 (queue full, no healthy card) and LiteLLM's own
  connection errors go once more; a timeout, a 500 or a 502 may have generated tokens already and are returned
  as they are (LiteLLM 1.106 reports a refused connection as a 500, so it is returned too);
- a host that fails more than `allowed_fails` times is left out for `cooldown` seconds (passive health
  checks: an active one would spend a card's time on a generation at every interval, and dcu-proxy checks
  its cards itself);
- timeouts long enough for multimodal requests (many images, long answers): `request_timeout`;
- the hosts' dcu-proxy over TLS where they serve it (dcu_proxy_tls), verified with their CA (`hosts_ca`, a file on
  the gateway), never unverified;
- no message logging, no spend logs, no database; LiteLLM's cost map is read from its own package
  (LITELLM_LOCAL_MODEL_COST_MAP, set by the role), and tests/gateway proves it connects nowhere else;
- MinerU's API (settings `mineru`, off unless the inventory turns it on): one LiteLLM pass-through per host whose
  dcu-proxy is MinerU's entrance, at /mineru/<host>/ (its file_parse, tasks, health). One path per host, not one
  path for all: a pass-through has one target and no routing, and a task lives on the host that took it (its
  upload and results in that host's MinerU), so its status and result must be read where it was submitted - the
  caller picks the host and keeps it for the task. Each call carries the caller's key (auth.py: its limits, and
  X-Caller), the gateway's secret to the host, the hosts' CA (LiteLLM's ssl_verify covers pass-throughs too), and
  X-MinerU-Entrance, the path callers reach it by, which dcu-proxy puts in a task's status_url and result_url.
  The host's upload limit (its dcu_mineru_max_upload_mb) is checked at the gateway before anything is sent
  (MINERU_UPLOADS_ENV, read by auth.py).
"""

import json
import re

CALLER_AUTH = "dcu_serving.gateway.auth.user_api_key_auth"
# The secret the gateway proves itself with to every serving host's dcu-proxy (gateway.secret there): the deployments'
# api_key, which LiteLLM reads from this variable of its environment (roles/dcu_gateway writes it from the vault) and
# sends as `Authorization: Bearer` - on callers' requests and on its own health checks alike.
PROXY_SECRET_ENV = "DCU_GATEWAY_PROXY_SECRET"
CALLER_HOOK = "dcu_serving.gateway.hooks.caller_header"
DEFAULTS = {"request_timeout": 900, "retries": 1, "allowed_fails": 3, "cooldown": 30}
URL = re.compile(r"^https?://[^/\s]+$")
# MinerU's API at the gateway (docs/fleet.md, "Document parsing"): /mineru/<host>/ for each host that serves it.
MINERU_PREFIX = "/mineru"
# {gateway path: the host's upload limit in bytes}, JSON, in LiteLLM's environment (the config's environment_variables)
MINERU_UPLOADS_ENV = "DCU_GATEWAY_MINERU_UPLOADS"
# What a host's dcu-proxy puts in the task URLs it answers with, instead of its own address (dcu_serving.proxy.mineru).
MINERU_ENTRANCE_HEADER = "X-MinerU-Entrance"
# Seconds the gateway waits for a parse beyond the host's own deadline, so the caller gets the host's 504, not a cut.
MINERU_TIMEOUT_MARGIN = 30
HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# LiteLLM's mode for a model of each kind (dcu_vllm_model_kinds): its health check asks a deployment in that API - a
# chat probe to a speech model gets dcu-proxy's 400 and counts it unhealthy. Chat and vision: LiteLLM's default.
MODES = {"embedding": "embedding", "rerank": "rerank", "transcription": "audio_transcription",
         "speech": "audio_speech"}


class FleetError(ValueError):
    pass


def deployments(hosts):
    """One LiteLLM deployment per (host, model); `kinds` ({model: kind}, optional) gives its mode."""
    out, seen = [], set()
    for i, host in enumerate(hosts or []):
        where = f"dcu_gateway_hosts[{i}]"
        if not isinstance(host, dict) or not host.get("name") or not host.get("url"):
            raise FleetError(f"{where}: needs name and url (the host's dcu-proxy, e.g. http://10.0.0.11:8000)")
        url = str(host["url"]).rstrip("/")
        if not URL.match(url):
            raise FleetError(f"{where}.url: {url!r} is not a base URL like http://10.0.0.11:8000 (no path)")
        models = host.get("models") or []
        if not isinstance(models, list) or not models:
            raise FleetError(f"{where}.models: the host {host['name']} serves no model; list its served model names")
        kinds = host.get("kinds") or {}
        for model in models:
            key = (host["name"], str(model))
            if key in seen:
                continue
            seen.add(key)
            out.append({
                "model_name": str(model),
                "litellm_params": {
                    "model": f"hosted_vllm/{model}",  # OpenAI-compatible, no provider-specific rewriting
                    "api_base": url + "/v1",
                    # dcu-proxy believes the gateway by its secret (and address), never by address alone
                    "api_key": "os.environ/" + PROXY_SECRET_ENV,
                },
                "model_info": {"id": f"{host['name']}/{model}",
                               **({"mode": MODES[kinds[model]]} if kinds.get(model) in MODES else {})},
            })
    if not out:
        raise FleetError("dcu_gateway_hosts: no serving host; put the hosts in the group dcu_gateway_serving_group "
                         "names, or list them in dcu_gateway_hosts")
    return out


def mineru_endpoints(hosts, public_url, request_timeout):
    """LiteLLM pass-through endpoints for MinerU's API on each host whose dcu-proxy is its entrance (a host entry's
    `mineru`: {max_upload_mb, timeout}, dcu_mineru's export dcu_mineru_proxy_entrance), and the upload limits by
    path."""
    endpoints, uploads = [], {}
    if not public_url or not URL.match(str(public_url).rstrip("/")):
        raise FleetError(f"dcu_gateway_mineru: the gateway's public URL {public_url!r} is not a base URL like "
                         "https://10.0.0.5:4000 (dcu_gateway_public_url); task URLs point there")
    public_url = str(public_url).rstrip("/")
    for i, host in enumerate(hosts or []):
        mineru = host.get("mineru") or {}
        if not mineru:
            continue
        name = str(host["name"])
        if not HOST_NAME.match(name):
            raise FleetError(f"dcu_gateway_hosts[{i}].name: {name!r} cannot be a path of the gateway (/mineru/<host>)")
        limit = mineru.get("max_upload_mb")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise FleetError(f"dcu_gateway_hosts[{i}].mineru.max_upload_mb: {limit!r}; the host's "
                             "dcu_mineru_max_upload_mb, a whole number >= 1")
        timeout = mineru.get("timeout")
        path = f"{MINERU_PREFIX}/{name}"
        endpoints.append({
            "path": path,
            "target": str(host["url"]).rstrip("/") + MINERU_PREFIX,
            "include_subpath": True,
            "auth": True,  # the caller's key, by custom_auth (auth.py), with its limits
            "methods": ["GET", "POST"],
            "headers": {"Authorization": "Bearer os.environ/" + PROXY_SECRET_ENV,
                        MINERU_ENTRANCE_HEADER: public_url + path},
            "timeout": (timeout if isinstance(timeout, int) and timeout > 0 else request_timeout)
            + MINERU_TIMEOUT_MARGIN,
        })
        uploads[path] = limit << 20
    if not endpoints:
        raise FleetError("dcu_gateway_mineru is true, but no serving host has MinerU's API through its dcu-proxy: "
                         "set dcu_mineru_entrance: proxy on the hosts that run MinerU (dcu_mineru_vlm_model), or "
                         "dcu_gateway_mineru: false")
    return endpoints, uploads


def gateway_config(hosts, settings=None):
    s = dict(DEFAULTS)
    s.update({k: v for k, v in (settings or {}).items() if v is not None})
    for key in DEFAULTS:
        if not isinstance(s[key], int) or isinstance(s[key], bool) or s[key] < 0:
            raise FleetError(f"dcu_gateway_{key}: {s[key]!r}; give a whole number >= 0")
    retries = s["retries"]
    model_list = deployments(hosts)
    over_tls = sorted({h["name"] for h in hosts if str(h["url"]).startswith("https://")})
    mineru, uploads = ([], {})
    if s.get("mineru"):
        mineru, uploads = mineru_endpoints(hosts, s.get("public_url"), s["request_timeout"])
    if over_tls and not s.get("hosts_ca"):
        raise FleetError(f"the serving hosts {', '.join(over_tls)} answer over TLS, but the gateway has no CA to "
                         "verify them with: give hosts_ca (dcu_gateway's file of the hosts' dcu_proxy_public_ca)")
    config = {
        "model_list": model_list,
        "router_settings": {
            "routing_strategy": "least-busy",
            "num_retries": retries,
            "retry_policy": {
                "DefaultRetries": retries,  # connection errors: nothing reached a card
                "ServiceUnavailableErrorRetries": retries,  # dcu-proxy's 503: queue full, no healthy card
                "RateLimitErrorRetries": retries,
                "TimeoutErrorRetries": 0,
                "InternalServerErrorRetries": 0,
                "BadRequestErrorRetries": 0,
                "AuthenticationErrorRetries": 0,
                "ContentPolicyViolationErrorRetries": 0,
                "NotFoundErrorRetries": 0,
            },
            "allowed_fails": s["allowed_fails"],
            # LiteLLM 1.106 counts allowed_fails only under a policy (else it cools a host down past 50 % failures
            # in a minute, so a stopped host that had served well kept failing; the fleet scenario measured 11 of
            # 20). A refused connection reaches it as an InternalServerError.
            "allowed_fails_policy": {f"{error}AllowedFails": s["allowed_fails"] for error in (
                "InternalServerError", "BadGatewayError", "ServiceUnavailableError", "TimeoutError")},
            "cooldown_time": s["cooldown"],
            "timeout": s["request_timeout"],
        },
        "litellm_settings": {
            "callbacks": [CALLER_HOOK],
            "request_timeout": s["request_timeout"],
            "turn_off_message_logging": True,
            "redact_messages_in_exceptions": True,
            "drop_params": False,
            # LiteLLM's own CA bundle (certifi) knows no site's or lab's CA: the hosts' CA alone.
            **({"ssl_verify": s["hosts_ca"]} if over_tls else {}),
        },
        "general_settings": {
            "master_key": "os.environ/LITELLM_MASTER_KEY",
            "custom_auth": CALLER_AUTH,
            "disable_spend_logs": True,
            "background_health_checks": False,
        },
    }
    if mineru:
        config["general_settings"]["pass_through_endpoints"] = mineru
        config["environment_variables"] = {MINERU_UPLOADS_ENV: json.dumps(uploads, sort_keys=True)}
    return config
