"""What reached the test pager on a node (molecule/default's converge.yml starts alert-receiver there: each
notification Alertmanager sent to its webhook, one JSON line), and Alertmanager's and Prometheus' HTTP APIs on the
node (they listen on loopback; the node has python3, not curl)."""

from __future__ import annotations

import base64
import json
import urllib.parse

NOTIFICATIONS = "/var/lib/alert-receiver/notifications.jsonl"
ALERTMANAGER = "http://127.0.0.1:9093"
PROMETHEUS = "http://127.0.0.1:9090"

_FETCH = ("import base64, sys, urllib.request as u; "
          "req = u.Request(sys.argv[1], method=sys.argv[2], data=base64.b64decode(sys.argv[3]) or None, "
          "headers={'Content-Type': 'application/json'}); "
          "sys.stdout.write(u.urlopen(req, timeout=5).read().decode())")


def http(host, url: str, method: str = "GET", body=None):
    """One HTTP request from the node; the JSON answer."""
    data = base64.b64encode(json.dumps(body).encode()).decode() if body is not None else ""
    out = host.check_output(f"python3 -c {_FETCH!r} {url!r} {method} '{data}'")
    return json.loads(out) if out.strip() else None


def prometheus(host, path: str, **params):
    answer = http(host, f"{PROMETHEUS}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else ""))
    assert answer["status"] == "success", answer
    return answer["data"]


def alertmanager(host, path: str, method: str = "GET", body=None, **params):
    return http(host, f"{ALERTMANAGER}/api/v2{path}" + (f"?{urllib.parse.urlencode(params, doseq=True)}"
                                                         if params else ""), method, body)


def notifications(host) -> list[dict]:
    """Every notification the pager received so far, oldest first: {received, authorized, notification}."""
    text = host.run(f"cat {NOTIFICATIONS}").stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def alerts_in(notes: list[dict], status: str = "firing", **labels) -> list[tuple]:
    """(notification index, alert) for each alert with `status` whose labels include `labels`, over notifications."""
    found = []
    for index, note in enumerate(notes):
        for alert in note["notification"]["alerts"]:
            if alert["status"] == status and all(alert["labels"].get(k) == v for k, v in labels.items()):
                found.append((index, alert))
    return found


def our_silences(host, unit: str) -> list[dict]:
    """The silences the plays put on `unit` of the node (every state: active, expired)."""
    return [s for s in alertmanager(host, "/silences") if s["createdBy"].startswith("dcu.serving")
            and {"name": "unit", "value": unit, "isRegex": False, "isEqual": True} in s["matchers"]]
