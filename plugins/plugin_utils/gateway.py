# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What role dcu_gateway works out besides LiteLLM's config (module_utils/gateway_config.py): the problems of its
secrets, said without showing them; the callers' keys file (each key's SHA-256, never the key); the deployments it
is asked about and what its health probes found."""

import hashlib
import re

MIN_SECRET = 16
_WHOLE = re.compile(r"^[1-9][0-9]*$")
# LiteLLM's health error ends with its stack trace: the message is what comes before.
_STACK = " stack trace:"
ERROR_CHARS = 300


def caller_problems(master_key, callers):
    """Why the master key or the callers cannot be used, one line each; a caller is named by its position and alias,
    never by its key."""
    problems = []
    if len(str(master_key or "")) < MIN_SECRET:
        problems.append("dcu_gateway_master_key: missing or shorter than {} characters; put a long random one in "
                        "ansible-vault (ansible-vault encrypt_string) or the environment (lookup('env', ...))".format(
                            MIN_SECRET))
    callers = callers or []
    if not callers:
        problems.append("dcu_gateway_callers: empty; give each calling system {alias, key, rpm?, concurrent?}")
    aliases = []
    for index, caller in enumerate(callers):
        if not isinstance(caller, dict):
            problems.append("dcu_gateway_callers[{}] (not a mapping): needs alias and a key of {} characters or "
                            "more".format(index, MIN_SECRET))
            continue
        aliases.append(caller.get("alias") or "")
        if not caller.get("alias") or len(str(caller.get("key") or "")) < MIN_SECRET:
            problems.append("dcu_gateway_callers[{}] ({}): needs alias and a key of {} characters or more".format(
                index, caller.get("alias") or "no alias", MIN_SECRET))
        for limit in ("rpm", "concurrent"):
            value = caller.get(limit)
            if value is not None and not _WHOLE.match(str(value)):
                problems.append("dcu_gateway_callers[{}].{}: {}; a whole number >= 1, or leave it out for no "
                                "limit".format(index, limit, value))
    if len(set(aliases)) != len(aliases):
        problems.append("dcu_gateway_callers: each alias once (the alias names the caller in every results log)")
    return problems


def caller_keys(callers):
    """The keys file's entries: [{alias, sha256 (of the key), rpm, concurrent}] - the gateway compares sums."""
    return [{"alias": caller["alias"], "sha256": hashlib.sha256(str(caller["key"]).encode("utf-8")).hexdigest(),
             "rpm": caller.get("rpm"), "concurrent": caller.get("concurrent")} for caller in callers or []]


def deployment_ids(config):
    """LiteLLM's id of each deployment the gateway's config holds (`<host>/<model>`, gateway_config's
    model_info.id), in its order: what the gateway reaches, read on the gateway itself, so a play limited to the
    gateway needs nothing of the serving hosts."""
    return [str(((entry or {}).get("model_info") or {}).get("id")) for entry in (config or {}).get("model_list") or []
            if ((entry or {}).get("model_info") or {}).get("id")]


def _error(bad):
    for result in bad:
        for endpoint in (result.get("json") or {}).get("unhealthy_endpoints") or []:
            if isinstance(endpoint, dict) and endpoint.get("error"):
                return str(endpoint["error"])
    for result in bad:
        if result.get("msg"):
            return str(result["msg"])
    return ""


def _shorten(text):
    text = text.split(_STACK)[0]
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS - 3].rsplit(" ", 1)[0] + "..."


def probe_results(results, key="__dcu_gateway_id"):
    """What the health probes found, per deployment: [{host, model, sent, answered, error}] from the loop results
    of GET /health?model_id=<id> (each with its id under `key`). A probe answered when LiteLLM counted a healthy
    endpoint; the error is the first unhealthy endpoint's (before its stack trace), else the request's own."""
    by_id, order = {}, []
    for result in results or []:
        deployment = result.get(key)
        if deployment not in by_id:
            by_id[deployment] = []
            order.append(deployment)
        by_id[deployment].append(result)
    probes = []
    for deployment in order:
        sent = by_id[deployment]
        bad = [r for r in sent if not ((r.get("json") or {}).get("healthy_count") or 0)]
        host, model = str(deployment).split("/", 1)
        probes.append({"host": host, "model": model, "sent": len(sent), "answered": len(sent) - len(bad),
                       "error": _shorten(_error(bad)) if bad else None})
    return probes
