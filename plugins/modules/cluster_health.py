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
  - Polls the proxy's C(/__lb_status) until the backends that take callers - healthy and not drained - reach
    O(expected) or O(timeout) passes. A drained backend is named with how to bring it back.
  - A drain is lifted only by what made it (a rolling restart undrains each instance it restarted; a failed one
    leaves its instance drained on purpose), never by waiting. So when the backends not drained cannot reach
    O(expected) and no unit of O(units) is starting, the module fails at once, naming each drained backend's unit
    and the C(rolling_restart.yml) command that restarts, checks and undrains it.
  - Optionally probes each backend's C(/health) and C(/v1/models) directly, and sends real requests through
    the proxy to prove the service answers end to end - one chat completion with an image; or, given
    O(instances) of model services, one request per service in its own API (chat, vision, embeddings,
    rerank, transcription, speech synthesis).
  - A proxy that refuses connections fails the wait in seconds, not at O(timeout) - at once when its configuration
    (O(proxy_config)) names another port, after O(refused_grace) when its unit is active - naming the URL it tried
    and where that URL came from (O(url_source)).
  - "On failure the message is a per-card diagnosis naming the unit to look at, for example
    C(card 5: connection refused on 127.0.0.1:8007 — journalctl -u vllm@5)."
  - Given O(units), reads their systemd states (one C(systemctl show)) before each poll, and fails at once
    when one has settled failed - C(failed), C(inactive), not installed, or restarting after O(unit_failures)
    failures - naming the unit, its state, the command that shows why and the last lines of its journal. Only
    units still starting are waited for.
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
    description:
      - Base URL of dcu-proxy, C(http://) or C(https://) with a host and an optional port - where role C(dcu_proxy)
        says it answers (its export C(dcu_proxy_url)).
    type: str
    default: http://127.0.0.1:8000
  url_source:
    description:
      - Where O(url) came from, said with it when the proxy cannot be reached there, for example
        C(dcu_proxy_listen 0.0.0.0:9000 (dcu.serving.dcu_proxy's dcu_proxy_url)) - its export C(dcu_proxy_url_source).
    type: str
  proxy_config:
    description:
      - dcu-proxy's configuration on the host. When the proxy refuses connections on O(url) and this file says it
        listens on another port, the module fails at once naming both, instead of waiting for O(timeout).
    type: path
    default: /etc/dcu-serving/proxy.yml
  refused_grace:
    description:
      - Seconds the proxy may refuse connections on O(url) while its unit C(dcu-proxy) is active before the module
        fails - a proxy that has started and still refuses listens elsewhere (or not at all). While the unit starts,
        or where systemd cannot be asked, the wait goes on until O(timeout).
    type: float
    default: 5
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
  units:
    description:
      - systemd units that must be active, for example C(vllm@0) ... C(vllm@7) and C(dcu-proxy). A unit that
        has settled failed fails the module at once; the wait goes on only while some unit is still starting,
        and N/N behind the proxy counts only once every unit is active (a unit in C(start-post) may already
        answer C(/health)). While one starts, the units are read every 0.5 s.
    type: list
    elements: str
    default: []
  unit_failures:
    description:
      - A unit that systemd restarts (C(Restart=on-failure)) counts as failed once it has failed this many
        times since it was last started by hand (its C(NRestarts) + 1); before that it is waited for.
    type: int
    default: 2
  host:
    description:
      - The host's name in the inventory, for the C(--limit) of the commands a diagnosis gives. The action plugin
        sets it (C(inventory_hostname)).
    type: str
  report_every:
    description:
      - Seconds after which the module returns, not failed, with the units and backends it still waits for
        (RV(waiting)) when O(timeout) has not passed yet; V(0) waits until O(timeout). The action plugin sets
        it (10 s unless given), prints what is awaited and calls the module again until O(timeout).
    type: float
    default: 0
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
  description: Backends that take callers, healthy and not drained.
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
    - {url: "http://127.0.0.1:8002", card: 0, unit: "vllm@0", healthy: true, draining: false, active: 0,
       last_error: null, health: 200, models: ["MiniCPM-V-4.5"], diagnosis: null}
units:
  description: Each of O(units) with its systemd state, as of the last poll.
  returned: when O(units) is given
  type: list
  elements: dict
  sample:
    - {unit: "vllm@3", state: "failed", active: "activating", sub: "auto-restart", result: "exit-code",
       restarts: 1, why: "keeps failing - 2 failures since it was started by hand (Result=exit-code)"}
waiting:
  description: What is still awaited when O(report_every) passed first, one short line each.
  returned: when the module returns before O(timeout) because of O(report_every)
  type: list
  elements: str
  sample: ["vllm@3 activating (start-post) for 12s", "7/8 healthy behind the proxy"]
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

import re
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils import addresses, host_paths
from ansible_collections.dcu.serving.plugins.module_utils.dcu_http import request
from ansible_collections.dcu.serving.plugins.module_utils.service_request import (
    answer_problem,
    send_request,
    server_error,
)


def host_port(url):
    return url.split("://", 1)[-1].rstrip("/")


def card_of(url, base_port):
    try:
        return int(host_port(url).rsplit(":", 1)[1]) - base_port
    except (IndexError, ValueError):
        return None


def serving(status):
    """The backends of a /__lb_status that take callers: healthy and not drained (a proxy that does not report
    `draining`: its own healthy count)."""
    backends = status.get("backends")
    if isinstance(backends, list) and backends and all(isinstance(b, dict) and "draining" in b for b in backends):
        return sum(1 for b in backends if b.get("healthy") and not b.get("draining"))
    return int(status.get("healthy", 0))


def drained(status):
    """How many backends of a /__lb_status are drained (0 from a proxy that does not report `draining`)."""
    backends = status.get("backends")
    return sum(1 for b in backends if isinstance(b, dict) and b.get("draining")) if isinstance(backends, list) else 0


def undrain_command(card, host):
    """The playbook that restarts an instance, sends it a real request and only then undrains it."""
    limit = " --limit %s" % host if host else ""
    return ("ansible-playbook -i <inventory> playbooks/rolling_restart.yml%s -e '{\"dcu_vllm_restart_cards\": [%s]}'"
            % (limit, card))


def describe_backend(entry, base_port, model, probe, instance=None, host=None):
    url = entry.get("url", "")
    card = card_of(url, base_port)
    if instance:
        unit, models = instance.get("unit") or "the unit serving %s" % url, list(instance.get("models") or [])
    else:
        unit, models = ("vllm@%s" % card if card is not None else "the unit serving %s" % url), [model]
    info = {
        "url": url, "card": card if not instance else (instance.get("cards") or [card])[0], "unit": unit,
        "healthy": bool(entry.get("healthy")), "draining": bool(entry.get("draining")), "active": entry.get("active"),
        "last_error": entry.get("last_error"), "health": None, "models": None, "diagnosis": None,
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
                info["diagnosis"] = "serves %s, not %s — check %s/%s.env" % (
                    names or "no models", ", ".join(missing), host_paths.host_path("vllm_env_dir"),
                    unit.split("@", 1)[-1])
    if info["diagnosis"] is None and not info["healthy"]:
        info["diagnosis"] = "ejected by the proxy: %s" % (info["last_error"] or "failing health checks")
    if info["draining"]:
        drain = ("drained in the proxy, so no caller reaches it, and waiting does not lift that (a failed restart "
                 "leaves its instance drained on purpose; a rolling restart running now holds it until it is back). "
                 "Once it can serve, `%s` restarts it, checks it with a real request and undrains it"
                 % undrain_command(info["card"], host))
        info["diagnosis"] = "%s; %s" % (info["diagnosis"], drain) if info["diagnosis"] else drain
    return info


def functional_requests(module, url, services, orid, timeout, backends):
    """One request per (model, kind) in `services`; fails naming the first service that does not answer."""
    known = set(host_port(b["url"]) for b in backends)
    results = []
    for model, kind in services:
        started = time.monotonic()
        api, res = send_request(url, kind, model, orid, timeout)
        out = {"model": model, "api": api, "status": res.status, "backend": res.headers.get("X-Backend"),
               "request_id": res.headers.get("X-Request-Id"), "latency_s": round(time.monotonic() - started, 3)}
        problem = None
        if res.status is None:
            problem = "the request through the proxy failed: %s" % res.error
        elif res.status != 200:
            problem = "the request through the proxy answered %s: %s" % (res.status, server_error(res))
        else:
            if api == "chat":
                choice = ((res.body or {}).get("choices") or [{}])[0]
                out["finish_reason"] = choice.get("finish_reason")
                out["completion_tokens"] = ((res.body or {}).get("usage") or {}).get("completion_tokens")
            problem = answer_problem(api, res.body, res.raw)
            if problem is None and out["backend"] not in known:
                problem = "X-Backend %r is not one of the proxy's backends %s" % (out["backend"], sorted(known))
        if problem:
            module.fail_json(msg="functional request (%s %s, orid %s): %s" % (api, model, orid, problem),
                             functional=out, requests=[*results, out])
        results.append(out)
    return results


# Seconds between looks while a unit is starting (one systemctl show and one local HTTP request).
UNIT_POLL = 0.5
PROXY_UNIT = "dcu-proxy"

# systemctl show's properties of a unit, enough to tell running, starting and settled failed apart.
UNIT_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "NRestarts",
                   "StateChangeTimestampMonotonic")


def unit_name(name):
    return name[:-len(".service")] if name.endswith(".service") else name


def parse_show(text):
    """systemctl show of several units (blocks separated by a blank line) -> {unit name: {property: value}}."""
    units = {}
    for block in text.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            units[unit_name(props["Id"])] = props
    return units


def unit_state(name, props, failures, now=None):
    """One unit's verdict from its systemctl show properties: a dict with state 'active', 'starting' or
    'failed', and `why` in words with the command that shows more."""
    load, active, sub = props.get("LoadState"), props.get("ActiveState"), props.get("SubState")
    result = props.get("Result") or "unknown"
    try:
        restarts = int(props.get("NRestarts") or 0)
    except ValueError:
        restarts = 0
    out = {"unit": name, "active": active, "sub": sub, "result": result, "restarts": restarts}
    journal = "journalctl -u %s -n 50" % name
    if load != "loaded":
        why = "is %s (LoadState=%s) - run playbooks/serving.yml, which installs it" % (
            "not installed" if load == "not-found" else "not loadable", load)
        return dict(out, state="failed", why=why)
    if active == "active":
        return dict(out, state="active", why="active (%s)" % sub)
    if sub == "auto-restart":
        # Restart=on-failure: it failed and systemd will start it again. NRestarts counts the automatic
        # restarts since the last start by hand, so this is failure number NRestarts + 1.
        if restarts + 1 >= failures:
            return dict(out, state="failed", why="keeps failing - %d failures since it was started by hand, "
                        "systemd restarts it again and again (Result=%s) - %s" % (restarts + 1, result, journal))
        return dict(out, state="starting", why="restarting after a failure (Result=%s)" % result)
    if active in ("activating", "reloading", "deactivating"):
        since, changed = "", props.get("StateChangeTimestampMonotonic") or "0"
        if now is not None and changed.isdigit() and 0 < int(changed) / 1e6 <= now:
            since = " for %ds" % (now - int(changed) / 1e6)
        return dict(out, state="starting", why="%s (%s)%s" % (active, sub, since))
    if active == "failed":
        # After StartLimitBurst starts systemd starts it no more, until reset-failed: always safe to say.
        return dict(out, state="failed", why="failed (Result=%s, %d restarts) - %s; once fixed: systemctl "
                    "reset-failed %s && systemctl start %s" % (result, restarts, journal, name, name))
    return dict(out, state="failed", why="is stopped (%s/%s) - systemctl start %s; why it stopped: %s" % (
        active, sub, name, journal))


def read_units(module, systemctl, names):
    """{name: unit_state} for the units, from one systemctl show."""
    rc, out, err = module.run_command([systemctl, "show", "--property=" + ",".join(UNIT_PROPERTIES), *names])
    if rc != 0:
        module.fail_json(msg="systemctl show %s failed (rc %s): %s" % (" ".join(names), rc, err.strip()))
    shown, now = parse_show(out), time.monotonic()
    return dict((name, unit_state(name, shown.get(unit_name(name), {}), module.params["unit_failures"], now))
                for name in names)


def journal_tail(module, name, lines=5):
    """The last lines the unit's own processes logged (a container's output goes there too, through the
    attached client), without systemd's lines about the unit: the cause, often."""
    journalctl = module.get_bin_path("journalctl")
    if not journalctl:
        return []
    unit = name if "." in name.rsplit("@", 1)[-1] else name + ".service"
    argv = [journalctl, "_SYSTEMD_UNIT=" + unit, "-n", str(lines), "--no-pager", "-o", "cat"]
    rc, out, _err = module.run_command(argv)
    return out.strip().splitlines()[-lines:] if rc == 0 else []


def configured_listen(path):
    """dcu-proxy's `listen` as its configuration file says (proxy.yml's top-level key, as dcu_proxy writes it), or
    None when the file or the key is not there."""
    try:
        with open(path) as handle:
            text = handle.read()
    except (IOError, OSError):
        return None
    match = re.search(r"^listen:[ \t]*(\S+)", text, re.M)
    return match.group(1).strip("'\"") if match else None


def refused_verdict(url, source, config, listen, unit, refused_for, grace):
    """Why waiting longer for a proxy that refuses connections on `url` would not help, or None while it may still
    come: its configuration names another address for this host's proxy (at once), or its unit has settled - active,
    or failed - and it has refused for `grace` seconds. `unit`: unit_state() of dcu-proxy, or None when systemd
    cannot be asked (then only the configuration can tell)."""
    said = "dcu-proxy refuses connections on %s%s" % (url, " (the URL from %s)" % source if source else "")
    try:
        configured = addresses.local_url(listen)
    except addresses.ListenError:
        configured = None
    here = urlsplit(url).hostname or ""
    if configured and configured != url and (here == "localhost" or addresses.is_loopback(here)):
        return ("%s, but %s says it listens on %s, which is %s: the URL is not the proxy's - a dcu_proxy_listen given "
                "to this play that differs from the one the proxy was installed with is the usual cause (run "
                "playbooks/serving.yml with it, or drop it)" % (said, config, listen, configured))
    if unit is not None and unit["state"] in ("active", "failed") and refused_for >= grace:
        return ("%s for %ds, and dcu-proxy.service %s%s - systemctl status dcu-proxy; journalctl -u dcu-proxy" % (
            said, refused_for, unit["why"], "; %s says it listens on %s" % (config, listen) if listen else ""))
    return None


def proxy_unit(module, systemctl):
    """unit_state() of dcu-proxy, or None where systemd cannot be asked (no systemctl, no systemd)."""
    if not systemctl:
        return None
    rc, out, _err = module.run_command([systemctl, "show", "--property=" + ",".join(UNIT_PROPERTIES), PROXY_UNIT])
    shown = parse_show(out).get(PROXY_UNIT) if rc == 0 else None
    return unit_state(PROXY_UNIT, shown, module.params["unit_failures"], time.monotonic()) if shown else None


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
    if p["unit_failures"] < 1:
        return "unit_failures: %s is less than 1; give after how many failures a restarting unit counts as failed" \
            % p["unit_failures"]
    if p["report_every"] < 0:
        return "report_every: %s is negative; give seconds between progress reports (0 for none)" % p["report_every"]
    if p["refused_grace"] < 0:
        return "refused_grace: %s is negative; give the seconds a refusing proxy is waited for" % p["refused_grace"]
    return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", default="http://127.0.0.1:8000"),
            url_source=dict(type="str"),
            proxy_config=dict(type="path", default=host_paths.host_path("proxy_config")),
            refused_grace=dict(type="float", default=5),
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
            units=dict(type="list", elements="str", default=[]),
            unit_failures=dict(type="int", default=2),
            report_every=dict(type="float", default=0),
            host=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    problem = argument_problem(p)
    if problem:
        module.fail_json(msg=problem)
    url = p["url"].rstrip("/")
    names = p["units"]
    systemctl = module.get_bin_path("systemctl", required=True) if names else None
    started = time.monotonic()
    deadline = started + p["timeout"]
    report_at = started + p["report_every"] if p["report_every"] else None
    units, starting, stuck = {}, [], False
    refused_since = listen = None
    while True:
        if names:
            units = read_units(module, systemctl, names)
            failed = [u for u in units.values() if u["state"] == "failed"]
            if failed:  # settled: waiting longer would not change it
                elapsed = round(time.monotonic() - started, 2)
                lines = []
                for u in failed:
                    tail = journal_tail(module, u["unit"])
                    last = ("; its last lines: " + " | ".join(tail)) if tail else ""
                    lines.append("%s %s%s" % (u["unit"], u["why"], last))
                module.fail_json(msg="%d of %d units failed (after %ss): %s" % (
                    len(failed), len(names), elapsed, "; ".join(lines)), units=list(units.values()), elapsed=elapsed)
        status = request(url + "/__lb_status", timeout=5)
        if status.error == "connection refused":
            now = time.monotonic()
            if refused_since is None:
                refused_since, listen = now, configured_listen(p["proxy_config"])
            unit = units.get(PROXY_UNIT) or proxy_unit(module, systemctl or module.get_bin_path("systemctl"))
            why = refused_verdict(url, p["url_source"], p["proxy_config"], listen, unit, now - refused_since,
                                  p["refused_grace"])
            if why:
                elapsed = round(now - started, 2)
                module.fail_json(msg="%s (after %ss)" % (why, elapsed), healthy=0, total=0, summary="0/0",
                                 elapsed=elapsed, backends=[], units=list(units.values()))
        else:
            refused_since = None
        body = status.body if status.ok and isinstance(status.body, dict) else None
        healthy, total = (serving(body), int(body.get("total", 0))) if body is not None else (0, 0)
        expected = p["expected"] if p["expected"] is not None else total
        starting = ["%s %s" % (u["unit"], u["why"]) for u in units.values() if u["state"] == "starting"]
        # A unit in start-post may already answer the proxy's health check: done only once it is active.
        if body is not None and total and healthy >= expected and not starting:
            break
        # Drained backends come back only when what drained them undrains them: if the others cannot make up
        # `expected`, no wait will (unless a unit is starting: a rolling restart at work, which undrains after).
        held = drained(body) if body is not None else 0
        if held and not starting and total - held < expected:
            stuck = True
            break
        waiting = [*starting, "%d/%d healthy behind the proxy" % (healthy, expected) if body is not None else
                   "dcu-proxy answers no status yet (%s)" % (status.error or "HTTP %s" % status.status)]
        now = time.monotonic()
        if now >= deadline:
            break
        if report_at is not None and now >= report_at:
            module.exit_json(changed=False, waiting=waiting, units=list(units.values()),
                             elapsed=round(now - started, 2), healthy=healthy, total=total,
                             summary="%d/%d" % (healthy, total), backends=[])
        # Polling interval of a deadline-bounded wait; shorter while a unit starts, so that the few seconds
        # of a restart loop's auto-restart state (RestartSec) are seen, not stepped over.
        time.sleep(min(p["interval"], UNIT_POLL) if starting else p["interval"])
    elapsed = round(time.monotonic() - started, 2)

    if body is None:
        cause = status.error or "HTTP %s" % status.status
        module.fail_json(
            msg="dcu-proxy does not answer on %s/__lb_status (%s)%s after %ss — systemctl status dcu-proxy; "
                "journalctl -u dcu-proxy" % (url, cause, "; the URL is from %s" % p["url_source"] if p["url_source"]
                                             else "", elapsed),
            healthy=0, total=0, summary="0/0", elapsed=elapsed, backends=[], units=list(units.values()))

    probe = p["check_backends"] or healthy < expected
    by_url = dict((str(i.get("url", "")).rstrip("/"), i) for i in p["instances"] or [])
    # Each backend's /health and /v1/models, all backends at once: the same requests, one backend's latency.
    entries = body.get("backends", [])
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(entries)))) as pool:
        backends = list(pool.map(lambda b: describe_backend(b, p["base_port"], p["model"], probe,
                                                            by_url.get(str(b.get("url", "")).rstrip("/")), p["host"]),
                                 entries))
    result = dict(changed=False, healthy=healthy, total=total, summary="%d/%d" % (healthy, total),
                  elapsed=elapsed, backends=backends)
    if names:
        result["units"] = list(units.values())
    problems = []
    for b in backends:
        if b["diagnosis"]:
            where = b["unit"] if by_url else "card %s" % b["card"]
            serves = b["healthy"] and b["health"] in (None, 200) and b["diagnosis"].startswith("drained")
            journal = "" if serves else " — journalctl -u %s" % b["unit"]  # a sound instance, only drained
            problems.append("%s: %s%s" % (where, b["diagnosis"], journal))
    problems.extend("%s still %s" % (u["unit"], u["why"]) for u in units.values() if u["state"] == "starting")
    if total < expected:
        problems.insert(0, "the proxy knows %d backends, %d expected — check %s" % (
            total, expected, p["proxy_config"]))
    if healthy < expected or starting or (p["check_backends"] and problems):
        module.fail_json(msg="%d/%d healthy (expected %d) after %ss%s: %s" % (
            healthy, total, expected, elapsed, ", not waiting for drained backends" if stuck else "",
            "; ".join(problems) or "no per-card cause found"), **result)
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
