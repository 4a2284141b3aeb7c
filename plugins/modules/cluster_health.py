#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: cluster_health
short_description: Wait until every vLLM instance behind dcu-proxy is healthy, and say why not
description:
  - Polls the proxy's C(/__lb_status) until C(healthy) reaches O(expected) or O(timeout) passes.
  - Optionally probes each backend's C(/health) and C(/v1/models) directly, and sends real requests through
    the proxy to prove the service answers end to end - one chat completion with an image; or, given
    O(instances) of model services, one request per service in its own API (chat, vision, embeddings,
    rerank, transcription).
  - "On failure the message is a per-card diagnosis naming the unit to look at, for example
    C(card 5: connection refused on 127.0.0.1:8007 — journalctl -u vllm@5)."
version_added: "0.1.0"
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
    details:
      - Read-only, so it runs the same in check mode. With O(functional_request=true) it sends its one chat
        completion in check mode too; the proxy records it in the results log under O(orid).
  diff_mode:
    support: none
requirements:
  - dcu-proxy listening on O(url), reachable from the managed host.
seealso:
  - module: ansible.builtin.uri
    description: Polls one URL; this module reads the proxy's status and names the card and unit behind a failure.
  - module: dcu.serving.dcu_facts
    description: The cards whose vLLM instances this module checks.
options:
  url:
    description: Base URL of dcu-proxy, C(http://) or C(https://) with a host and an optional port.
    type: str
    default: http://127.0.0.1:8000
  expected:
    description:
      - How many backends must be healthy. Defaults to the number of backends the proxy knows.
    type: int
  timeout:
    description: Seconds to keep polling before failing; V(0) polls once.
    type: float
    default: 300
  interval:
    description: Seconds between polls; more than 0.
    type: float
    default: 2
  instances:
    description:
      - The vLLM instances behind the proxy, as role dcu_vllm exports them in C(dcu_vllm_instances), each with
        its C(url), C(unit), C(models) and C(kind). Names each backend's unit in a diagnosis, checks that it
        serves its own models, and with O(functional_request) sends one request per service.
      - Without it, the default layout is assumed - every backend serves O(model), unit C(vllm@<index>) with
        index = port - O(base_port).
    type: list
    elements: dict
  base_port:
    description: Port of card 0's vLLM instance; card index = port - base_port (unit C(vllm@<index>)).
    type: int
    default: 8002
  check_backends:
    description: Also probe each backend's C(/health) and C(/v1/models) directly.
    type: bool
    default: false
  model:
    description: Served model name the backends must list and the functional request uses.
    type: str
    default: MiniCPM-V-4.5
  functional_request:
    description: Send one chat completion with a small image through the proxy and check the answer.
    type: bool
    default: false
  orid:
    description: Order id (C(user)) of the functional request, to find it in the results log.
    type: str
    default: cluster-health
  request_timeout:
    description: Seconds the functional request may take; more than 0.
    type: float
    default: 120
notes:
  - Talks to the proxy and the backends directly, never through an HTTP proxy that the host's environment
    sets (C(http_proxy), C(https_proxy)), and never with credentials from a C(~/.netrc).
"""

EXAMPLES = r"""
- name: Wait for 8/8 behind the proxy
  dcu.serving.cluster_health:
    expected: 8
    timeout: 600

- name: Prove the service end to end (read-only, safe on production)
  dcu.serving.cluster_health:
    expected: 8
    check_backends: true
    functional_request: true
    orid: "verify-{{ ansible_date_time.epoch }}"
"""

RETURN = r"""
healthy:
  description: Healthy backends.
  returned: always
  type: int
  sample: 8
total:
  description: Backends the proxy knows.
  returned: always
  type: int
  sample: 8
summary:
  description: C(healthy/total).
  returned: always
  type: str
  sample: 8/8
elapsed:
  description: Seconds spent polling.
  returned: always
  type: float
backends:
  description: One entry per backend, with the card index and unit derived from its port.
  returned: always
  type: list
  elements: dict
  sample:
    - {url: "http://127.0.0.1:8002", card: 0, unit: "vllm@0", healthy: true, active: 0,
       last_error: null, health: 200, models: ["MiniCPM-V-4.5"], diagnosis: null}
requests:
  description: Every functional request's result (one per service with O(instances)), each with its C(model),
    C(api), C(status), C(backend) and C(latency_s).
  returned: when O(functional_request) is true
  type: list
  elements: dict
functional:
  description: The (first) functional request's result.
  returned: when O(functional_request) is true
  type: dict
  sample: {status: 200, backend: "127.0.0.1:8005", finish_reason: "stop", latency_s: 0.41,
           request_id: "a1b2", completion_tokens: 12}
"""

import struct
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import prepare_multipart

from ansible_collections.dcu.serving.plugins.module_utils.dcu_http import request

# An 8x8 white PNG: the smallest honest image for a functional request.
PROBE_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAFUlEQVR42mP8//8/AzbAxIADDE4JAFbUAw3/dxQWAAAAAElFTkSuQmCC"


def host_port(url):
    return url.split("://", 1)[-1].rstrip("/")


def card_of(url, base_port):
    try:
        return int(host_port(url).rsplit(":", 1)[1]) - base_port
    except (IndexError, ValueError):
        return None


def describe_backend(entry, base_port, model, probe, instance=None):
    url = entry.get("url", "")
    card = card_of(url, base_port)
    if instance:
        unit, models = instance.get("unit") or "the unit serving %s" % url, list(instance.get("models") or [])
    else:
        unit, models = ("vllm@%s" % card if card is not None else "the unit serving %s" % url), [model]
    info = {
        "url": url, "card": card if not instance else (instance.get("cards") or [card])[0], "unit": unit,
        "healthy": bool(entry.get("healthy")), "active": entry.get("active"), "last_error": entry.get("last_error"),
        "health": None, "models": None, "diagnosis": None,
    }
    if probe:
        health = request(url.rstrip("/") + "/health", timeout=5)
        info["health"] = health.status
        if health.status is None:
            info["diagnosis"] = "%s on %s" % (health.error, host_port(url))
        elif health.status != 200:
            info["diagnosis"] = "engine unhealthy (/health answered %s)" % health.status
        else:
            listed = request(url.rstrip("/") + "/v1/models", timeout=5)
            names = [m.get("id") for m in ((listed.body or {}).get("data") or []) if isinstance(m, dict)]
            info["models"] = names
            missing = [name for name in models if name not in names]
            if missing:
                info["diagnosis"] = "serves %s, not %s — check /etc/dcu-serving/vllm/%s.env" % (
                    names or "no models", ", ".join(missing), unit.split("@", 1)[-1])
    if info["diagnosis"] is None and not info["healthy"]:
        info["diagnosis"] = "ejected by the proxy: %s" % (info["last_error"] or "failing health checks")
    return info


def _wav(seconds=0.5, rate=16000):
    """A short silent 16-bit mono WAV: the smallest honest audio for a transcription request."""
    frames = int(seconds * rate)
    data = b"\x00\x00" * frames
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate,
            rate * 2, 2, 16) + b"data" + struct.pack("<I", len(data)) + data)


def _chat(model, orid, image):
    content = [{"type": "text", "text": "Describe the image in one sentence." if image else "Say OK."}]
    if image:
        content.insert(0, {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PROBE_PNG}})
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 64,
            "temperature": 0.2, "user": orid, "chat_template_kwargs": {"enable_thinking": False}}


def _answer_problem(api, body):
    """Why an answer of `api` does not prove the service works, or None."""
    body = body or {}
    if api == "chat":
        choice = (body.get("choices") or [{}])[0]
        if not (choice.get("message") or {}).get("content"):
            return "the answer was empty (finish_reason %s)" % choice.get("finish_reason")
    elif api == "embeddings":
        if not ((body.get("data") or [{}])[0].get("embedding")):
            return "the answer holds no embedding"
    elif api == "rerank":
        if not body.get("results"):
            return "the answer ranks no document"
    elif api == "transcriptions" and "text" not in body:
        return "the answer holds no text"
    return None


def probe_request(url, kind, model, orid, timeout):
    """(api, HttpResult) of one real request of the service's kind, through the proxy."""
    base = url.rstrip("/")
    if kind == "embedding":
        return "embeddings", request(base + "/v1/embeddings", method="POST", timeout=timeout,
                                     payload={"model": model, "input": "dcu-serving verify", "user": orid})
    if kind == "rerank":
        return "rerank", request(base + "/v1/rerank", method="POST", timeout=timeout, payload={
            "model": model, "query": "DCU card", "documents": ["a DCU card serves models", "bread"], "user": orid})
    if kind == "transcription":
        content_type, body = prepare_multipart({"model": model, "user": orid, "response_format": "json", "file": {
            "filename": "verify.wav", "content": _wav(), "mime_type": "audio/wav"}})
        return "transcriptions", request(base + "/v1/audio/transcriptions", method="POST", timeout=timeout,
                                         data=body, content_type=content_type)
    return "chat", request(base + "/v1/chat/completions", method="POST", timeout=timeout,
                           payload=_chat(model, orid, image=kind != "chat"))


def functional_requests(module, url, services, orid, timeout, backends):
    """One request per (model, kind) in `services`; fails naming the first service that does not answer."""
    known = set(host_port(b["url"]) for b in backends)
    results = []
    for model, kind in services:
        started = time.monotonic()
        api, res = probe_request(url, kind, model, orid, timeout)
        out = {"model": model, "api": api, "status": res.status, "backend": res.headers.get("X-Backend"),
               "request_id": res.headers.get("X-Request-Id"), "latency_s": round(time.monotonic() - started, 3)}
        problem = None
        if res.status is None:
            problem = "the request through the proxy failed: %s" % res.error
        elif res.status != 200:
            err = (res.body or {}).get("error") if isinstance(res.body, dict) else None
            message = err.get("message") if isinstance(err, dict) else res.raw[:300]
            problem = "the request through the proxy answered %s: %s" % (res.status, message)
        else:
            if api == "chat":
                choice = ((res.body or {}).get("choices") or [{}])[0]
                out["finish_reason"] = choice.get("finish_reason")
                out["completion_tokens"] = ((res.body or {}).get("usage") or {}).get("completion_tokens")
            problem = _answer_problem(api, res.body)
            if problem is None and out["backend"] not in known:
                problem = "X-Backend %r is not one of the proxy's backends %s" % (out["backend"], sorted(known))
        if problem:
            module.fail_json(msg="functional request (%s %s, orid %s): %s" % (api, model, orid, problem),
                             functional=out, requests=[*results, out])
        results.append(out)
    return results


def argument_problem(p):
    """The first argument error, naming the option, or None. Checked before anything is polled."""
    url = urlsplit(p["url"])
    try:
        port_ok = url.port is None or url.port > 0  # ValueError for a port that is no number in range
    except ValueError:
        port_ok = False
    if url.scheme not in ("http", "https") or not url.hostname or not port_ok:
        return ("url: %r is not an http:// or https:// URL with a host and an optional port, for example "
                "http://127.0.0.1:8000" % p["url"])
    if p["interval"] <= 0:
        return "interval: %s is not a positive number of seconds between polls" % p["interval"]
    if p["timeout"] < 0:
        return "timeout: %s is negative; give the seconds to keep polling (0 polls once)" % p["timeout"]
    if p["request_timeout"] <= 0:
        return "request_timeout: %s is not a positive number of seconds" % p["request_timeout"]
    if p["expected"] is not None and p["expected"] < 0:
        return "expected: %s is negative; give how many backends must be healthy" % p["expected"]
    return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", default="http://127.0.0.1:8000"),
            expected=dict(type="int"),
            timeout=dict(type="float", default=300),
            interval=dict(type="float", default=2),
            base_port=dict(type="int", default=8002),
            check_backends=dict(type="bool", default=False),
            instances=dict(type="list", elements="dict"),
            model=dict(type="str", default="MiniCPM-V-4.5"),
            functional_request=dict(type="bool", default=False),
            orid=dict(type="str", default="cluster-health"),
            request_timeout=dict(type="float", default=120),
        ),
        supports_check_mode=True,
    )
    p = module.params
    problem = argument_problem(p)
    if problem:
        module.fail_json(msg=problem)
    url = p["url"].rstrip("/")
    started = time.monotonic()
    deadline = started + p["timeout"]
    while True:
        status = request(url + "/__lb_status", timeout=5)
        body = status.body if status.ok and isinstance(status.body, dict) else None
        if body is not None:
            healthy, total = int(body.get("healthy", 0)), int(body.get("total", 0))
            expected = p["expected"] if p["expected"] is not None else total
            if total and healthy >= expected:
                break
        if time.monotonic() >= deadline:
            break
        time.sleep(p["interval"])  # polling interval of a deadline-bounded wait
    elapsed = round(time.monotonic() - started, 2)

    if body is None:
        cause = status.error or "HTTP %s" % status.status
        module.fail_json(
            msg="dcu-proxy does not answer on %s/__lb_status (%s) after %ss — systemctl status dcu-proxy; "
                "journalctl -u dcu-proxy" % (url, cause, elapsed),
            healthy=0, total=0, summary="0/0", elapsed=elapsed, backends=[])

    probe = p["check_backends"] or healthy < expected
    by_url = dict((str(i.get("url", "")).rstrip("/"), i) for i in p["instances"] or [])
    # Each backend's /health and /v1/models, all backends at once: the same requests, one backend's latency.
    entries = body.get("backends", [])
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(entries)))) as pool:
        backends = list(pool.map(lambda b: describe_backend(b, p["base_port"], p["model"], probe,
                                                            by_url.get(str(b.get("url", "")).rstrip("/"))), entries))
    result = dict(changed=False, healthy=healthy, total=total, summary="%d/%d" % (healthy, total),
                  elapsed=elapsed, backends=backends)
    problems = []
    for b in backends:
        if b["diagnosis"]:
            where = b["unit"] if by_url else "card %s" % b["card"]
            problems.append("%s: %s — journalctl -u %s" % (where, b["diagnosis"], b["unit"]))
    if total < expected:
        problems.insert(0, "the proxy knows %d backends, %d expected — check /etc/dcu-serving/proxy.yml"
                        % (total, expected))
    if healthy < expected or (p["check_backends"] and problems):
        module.fail_json(msg="%d/%d healthy (expected %d) after %ss: %s" % (
            healthy, total, expected, elapsed, "; ".join(problems) or "no per-card cause found"), **result)
    if p["functional_request"]:
        services = []
        for instance in p["instances"] or [{"models": [p["model"]], "kind": "vision"}]:
            service = ((instance.get("models") or [p["model"]])[0], instance.get("kind") or "vision")
            if service not in services:
                services.append(service)
        result["requests"] = functional_requests(module, url, services, p["orid"], p["request_timeout"], backends)
        result["functional"] = result["requests"][0]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
