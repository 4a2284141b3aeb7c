# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What role dcu_alertmanager works out: Alertmanager's configuration from the inventory's receivers and routes, with
the grouping and inhibitions of a DCU host; the files its secrets go in (never the configuration, so that a --diff
of it shows no secret); the problems of the settings, each naming the variable; and the silences and alerts the
plays that change a host send (docs/operations.md, "Alerts")."""

import re
from datetime import datetime, timedelta, timezone

from ansible_collections.dcu.serving.plugins.module_utils.addresses import local_url

# Alerts that stand for many: while one fires on a host, the alerts it causes on the same host are held back
# (rule names from dcu_prometheus' templates/dcu-serving.rules.yml.j2).
INHIBIT_RULES = [
    # Prometheus reaches none of the host's services: one page for the host, not one per card, instance and proxy.
    {"source_matchers": ['alertname="HostDown"'], "target_matchers": ['alertname!="HostDown"'], "equal": ["host"]},
    # No card of the host is healthy (the driver stopped, hy-smi does not answer): one page for the driver, not one
    # per card, per instance that died with it, or for the errors and queue that follow.
    {"source_matchers": ['alertname="DCUDriverDown"'],
     "target_matchers": ['alertname=~"DCUCardMissing|DCUVRAMNearFull|BackendErrorRatio|ProxyErrorRatio|'
                         'ProxyQueueGrowing"'],
     "equal": ["host"]},
    {"source_matchers": ['alertname="DCUDriverDown"'], "target_matchers": ['alertname="InstanceDown"', 'job="vllm"'],
     "equal": ["host"]},
    # An instance that is down: the errors its backend answered on the way down are its consequence.
    {"source_matchers": ['alertname="InstanceDown"', 'job="vllm"'],
     "target_matchers": ['alertname="BackendErrorRatio"'], "equal": ["host", "unit"]},
]

# The alert the plays that change a host raise when the change fails (entry point change_failed).
CHANGE_FAILED = "DCUChangeFailed"
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
_ADDRESS = re.compile(r"^[^\s:]+:[0-9]{1,5}$")
_SMTP_KEYS = ("smarthost", "from", "username", "password", "require_tls", "hello")
_RECEIVER_KEYS = ("name", "webhooks", "emails")
_WEBHOOK_KEYS = ("url", "bearer_token", "max_alerts")
_ROUTE_KEYS = ("receiver", "matchers", "continue", "group_by")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _safe(name):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))


def _token_path(secret_dir, index, receiver, hook):
    return "{}/webhook-{}-{}-{}.token".format(secret_dir, index, _safe(receiver.get("name")), hook)


def _smtp_password_path(secret_dir):
    return "{}/smtp-password".format(secret_dir)


def alertmanager_problems(receivers, smtp=None, default_receiver="", routes=None, timings=None):
    """Why the receivers, the SMTP settings, the default receiver, the routes or the timings cannot make a working
    configuration: one line each, naming the variable and what to write; a secret is never shown."""
    problems = []
    receivers = receivers if isinstance(receivers, list) else []
    if not receivers:
        problems.append("dcu_alertmanager_receivers: empty; alerts would reach nobody. Give at least one "
                        "{name, webhooks: [{url, bearer_token?}], emails: [address]} (docs/operations.md, Alerts)")
    names = []
    emails = False
    for index, receiver in enumerate(receivers):
        where = "dcu_alertmanager_receivers[{}]".format(index)
        if not isinstance(receiver, dict) or not receiver.get("name"):
            problems.append("{}: needs a name and webhooks or emails".format(where))
            continue
        where = "{} ({})".format(where, receiver["name"])
        names.append(str(receiver["name"]))
        unknown = sorted(set(receiver) - set(_RECEIVER_KEYS))
        if unknown:
            problems.append("{}: unknown key(s) {}; a receiver takes {}".format(
                where, ", ".join(unknown), ", ".join(_RECEIVER_KEYS)))
        webhooks = receiver.get("webhooks") or []
        addresses = receiver.get("emails") or []
        if not webhooks and not addresses:
            problems.append("{}: give webhooks ([{{url, bearer_token?}}]) or emails ([address]), or both".format(where))
        if not isinstance(webhooks, list) or not isinstance(addresses, list):
            problems.append("{}: webhooks and emails are lists".format(where))
            continue
        for hook, webhook in enumerate(webhooks):
            url = webhook.get("url") if isinstance(webhook, dict) else None
            if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
                problems.append("{}.webhooks[{}]: needs url: http(s)://HOST[:PORT]/PATH".format(where, hook))
                continue
            unknown = sorted(set(webhook) - set(_WEBHOOK_KEYS))
            if unknown:
                problems.append("{}.webhooks[{}]: unknown key(s) {}; a webhook takes {}".format(
                    where, hook, ", ".join(unknown), ", ".join(_WEBHOOK_KEYS)))
            token = webhook.get("bearer_token")
            if token is not None and (not isinstance(token, str) or not token.strip()):
                problems.append("{}.webhooks[{}].bearer_token: empty; give the token (ansible-vault) or leave the key "
                                "out".format(where, hook))
        for mail, address in enumerate(addresses):
            if not isinstance(address, str) or not re.match(r"^[^@\s]+@[^@\s]+$", address):
                problems.append("{}.emails[{}]: not an e-mail address".format(where, mail))
        emails = emails or bool(addresses)
    if len(set(names)) != len(names):
        problems.append("dcu_alertmanager_receivers: each name once (routes name receivers)")
    smtp = smtp or {}
    if not isinstance(smtp, dict):
        problems.append("dcu_alertmanager_smtp: a mapping {smarthost, from, username?, password?, require_tls?}")
        smtp = {}
    unknown = sorted(set(smtp) - set(_SMTP_KEYS))
    if unknown:
        problems.append("dcu_alertmanager_smtp: unknown key(s) {}; it takes {}".format(", ".join(unknown),
                                                                                       ", ".join(_SMTP_KEYS)))
    if emails and (not _ADDRESS.match(str(smtp.get("smarthost") or "")) or "@" not in str(smtp.get("from") or "")):
        problems.append("dcu_alertmanager_smtp: a receiver sends e-mail; give smarthost (HOST:PORT of the mail relay, "
                        "e.g. mail.example.internal:587) and from (the sender's address)")
    if smtp.get("password") is not None and not smtp.get("username"):
        problems.append("dcu_alertmanager_smtp: a password needs its username")
    if default_receiver and default_receiver not in names:
        problems.append("dcu_alertmanager_receiver: {!r} is no receiver's name (receivers: {})".format(
            default_receiver, ", ".join(names) or "none"))
    for index, route in enumerate(routes or []):
        where = "dcu_alertmanager_routes[{}]".format(index)
        if not isinstance(route, dict):
            problems.append("{}: a mapping {{receiver, matchers}}".format(where))
            continue
        unknown = sorted(set(route) - set(_ROUTE_KEYS))
        if unknown:
            problems.append("{}: unknown key(s) {}; a route takes {}".format(where, ", ".join(unknown),
                                                                             ", ".join(_ROUTE_KEYS)))
        if route.get("receiver") not in names:
            problems.append("{}.receiver: {!r} is no receiver's name (receivers: {})".format(
                where, route.get("receiver"), ", ".join(names) or "none"))
        matchers = route.get("matchers")
        if not isinstance(matchers, list) or not matchers or not all(isinstance(m, str) for m in matchers):
            problems.append('{}.matchers: a list of label matchers, e.g. [\'severity="critical"\']'.format(where))
    for name, value in sorted((timings or {}).items()):
        if not _DURATION.match(str(value)):
            problems.append("dcu_alertmanager_{}: {!r} is no duration; write e.g. 30s, 5m, 4h".format(name, value))
    return problems


def alertmanager_secret_files(receivers, smtp, secret_dir):
    """The files the secrets go in, [{path, content}]: each webhook's bearer token, the SMTP password. The
    configuration names these files (alertmanager_config), never the secrets."""
    files = []
    for index, receiver in enumerate(receivers or []):
        for hook, webhook in enumerate(receiver.get("webhooks") or []):
            if webhook.get("bearer_token"):
                files.append({"path": _token_path(secret_dir, index, receiver, hook),
                              "content": str(webhook["bearer_token"]).strip() + "\n"})
    if (smtp or {}).get("password"):
        files.append({"path": _smtp_password_path(secret_dir), "content": str(smtp["password"])})
    return files


def alertmanager_config(receivers, smtp=None, default_receiver="", routes=None, settings=None, secret_dir="",
                        inhibit_rules=None):
    """Alertmanager's configuration (its YAML as a dict) from the inventory: every alert goes to default_receiver
    (the first receiver when empty) unless one of `routes` (first match wins, unless `continue`) takes it; alerts are
    grouped by settings.group_by (one notification per host and alert name by default: eight cards' alerts are one
    message); the inhibitions of a DCU host (INHIBIT_RULES) and inhibit_rules after them. Secrets are named by their
    files (alertmanager_secret_files).

    settings: group_by, group_wait, group_interval, repeat_interval, resolve_timeout, send_resolved."""
    settings = settings or {}
    send_resolved = bool(settings.get("send_resolved", True))
    smtp = smtp or {}
    config = {"global": {"resolve_timeout": str(settings.get("resolve_timeout", "5m"))}}
    if smtp.get("smarthost"):
        config["global"].update({"smtp_smarthost": str(smtp["smarthost"]), "smtp_from": str(smtp["from"]),
                                 "smtp_require_tls": bool(smtp.get("require_tls", True))})
        if smtp.get("hello"):
            config["global"]["smtp_hello"] = str(smtp["hello"])
        if smtp.get("username"):
            config["global"]["smtp_auth_username"] = str(smtp["username"])
        if smtp.get("password"):
            config["global"]["smtp_auth_password_file"] = _smtp_password_path(secret_dir)
    route = {"receiver": default_receiver or receivers[0]["name"],
             "group_by": list(settings.get("group_by", ["alertname", "host"])),
             "group_wait": str(settings.get("group_wait", "30s")),
             "group_interval": str(settings.get("group_interval", "5m")),
             "repeat_interval": str(settings.get("repeat_interval", "4h"))}
    child_routes = []
    for item in routes or []:
        child = {"receiver": item["receiver"], "matchers": list(item["matchers"])}
        if item.get("continue"):
            child["continue"] = True
        if item.get("group_by"):
            child["group_by"] = list(item["group_by"])
        child_routes.append(child)
    if child_routes:
        route["routes"] = child_routes
    config["route"] = route
    config["inhibit_rules"] = [dict(rule) for rule in INHIBIT_RULES] + list(inhibit_rules or [])
    config["receivers"] = []
    for index, receiver in enumerate(receivers):
        entry = {"name": receiver["name"]}
        webhooks = []
        for hook, webhook in enumerate(receiver.get("webhooks") or []):
            config_hook = {"url": webhook["url"], "send_resolved": send_resolved,
                           "max_alerts": int(webhook.get("max_alerts", 0))}
            if webhook.get("bearer_token"):
                config_hook["http_config"] = {"authorization": {
                    "type": "Bearer", "credentials_file": _token_path(secret_dir, index, receiver, hook)}}
            webhooks.append(config_hook)
        if webhooks:
            entry["webhook_configs"] = webhooks
        if receiver.get("emails"):
            entry["email_configs"] = [{"to": address, "send_resolved": send_resolved}
                                      for address in receiver["emails"]]
        config["receivers"].append(entry)
    return config


def _timestamp(moment):
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def change_silence(labels, seconds, who, why, silence_id="", now=None):
    """The body of Alertmanager's POST /api/v2/silences that holds back every alert carrying all of `labels` (e.g.
    {host, unit}) for `seconds` from now: the bound of a change, so that a play killed before it removes the silence
    leaves it to expire on its own. It starts a minute early: the controller's clock may run ahead of the host's.
    It never holds back DCUChangeFailed (a failed change's page names the same host and unit).
    With `silence_id`, it replaces that silence (Alertmanager expires it and keeps the new one): how a change that
    is over shortens its silence to the time Prometheus needs to see the instance serve again."""
    bad = sorted(name for name in labels if not _LABEL.match(str(name)))
    if not labels or bad or not all(str(v) for v in labels.values()):
        raise ValueError("a silence needs label names and non-empty values, got {!r}".format(labels))
    now = now or datetime.now(timezone.utc)
    # A change's own failure alert carries its host and unit too: it is never held back by a change's silence.
    body = {"matchers": [{"name": str(name), "value": str(value), "isRegex": False, "isEqual": True}
                         for name, value in sorted(labels.items())]
            + [{"name": "alertname", "value": CHANGE_FAILED, "isRegex": False, "isEqual": False}],
            "startsAt": _timestamp(now - timedelta(seconds=60)),
            "endsAt": _timestamp(now + timedelta(seconds=int(seconds))),
            "createdBy": str(who), "comment": str(why)}
    if silence_id:
        body["id"] = str(silence_id)
    return body


def change_alert(labels, summary, description, seconds, now=None):
    """The body of Alertmanager's POST /api/v2/alerts for a change that failed: one alert, firing from now for
    `seconds` (then resolved, unless sent again), labelled `labels` (alertname, host, unit, severity, ...)."""
    now = now or datetime.now(timezone.utc)
    return [{"labels": dict((str(k), str(v)) for k, v in labels.items() if v not in (None, "")),
             "annotations": {"summary": str(summary), "description": str(description)},
             "startsAt": _timestamp(now), "endsAt": _timestamp(now + timedelta(seconds=int(seconds)))}]


def alertmanager_urls(hosts, hostvars, default_listen):
    """{monitoring host: where its Alertmanager answers on that host}: its export dcu_alertmanager_url when this run
    set it, else worked out as the export does from its inventory's dcu_alertmanager_listen (default_listen, the
    role's default, when the inventory has none) - so that a play run with --limit on serving hosts still finds it."""
    urls = {}
    for host in hosts or []:
        facts = hostvars.get(host, {})
        url = facts.get("dcu_alertmanager_url")
        urls[host] = url or local_url(facts.get("dcu_alertmanager_listen") or default_listen,
                                      what="dcu_alertmanager_listen of {}".format(host))
    return urls
