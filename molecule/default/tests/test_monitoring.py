"""testinfra checks of monitoring on the emulated node (converge.yml ends with playbooks/monitoring.yml):
dcu-exporter as its own user, Prometheus and Alertmanager installed from the bundle with no package source, every
scrape target up, and a stopped instance's alert - fired in Prometheus and delivered once to the test pager (a real
webhook receiver on the node, converge.yml) - and the inhibitions that make a dead host or a stopped driver one page,
read through Prometheus' and Alertmanager's HTTP APIs on the node (they listen on loopback)."""

from __future__ import annotations

import json
import time
import urllib.parse
from datetime import UTC, datetime, timedelta

from pager import alertmanager, alerts_in, notifications
from testkit import steady_load

from support import wait_until  # tests/support.py, on pytest's pythonpath

CARDS = 8  # molecule.yml: cards: 8
PROMETHEUS = "http://127.0.0.1:9090"
# Prometheus itself, the card exporter, the proxy and one vLLM instance per card.
TARGETS = 3 + CARDS


def api(host, path: str, **params) -> dict:
    """GET Prometheus' API on the node (python3's urllib: the node has no curl); the JSON answer."""
    url = f"{PROMETHEUS}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    fetch = "import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=5).read().decode())"
    out = host.check_output(f"python3 -c {fetch!r} {url!r}")
    answer = json.loads(out)
    assert answer["status"] == "success", answer
    return answer["data"]


def up_by_target(host) -> dict:
    """{(job, unit or ''): value of up} for every target Prometheus scrapes."""
    return {(r["metric"]["job"], r["metric"].get("unit", "")): r["value"][1]
            for r in api(host, "/api/v1/query", query="up")["result"]}


def test_the_exporter_runs_as_its_own_user_in_the_device_groups_and_serves_the_cards(host):
    assert host.service("dcu-exporter").is_running
    assert host.service("dcu-exporter").is_enabled
    assert host.check_output("systemctl show --property=User --value dcu-exporter") == "dcu-exporter"
    shown = host.check_output("systemctl show --property=NoNewPrivileges,ProtectSystem,CapabilityBoundingSet,"
                              "PrivateTmp,ProtectKernelTunables dcu-exporter")
    hardening = dict(line.split("=", 1) for line in shown.splitlines())
    assert hardening == {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "CapabilityBoundingSet": "",
                         "PrivateTmp": "yes", "ProtectKernelTunables": "yes"}
    assert "127.0.0.1:9400" in host.check_output("ss -Hltn 'sport = :9400'")
    groups = host.user("dcu-exporter").groups
    assert host.file("/dev/kfd").group in groups and host.file("/dev/dri/renderD128").group in groups
    # The service label is the unit of the card's instance, from dcu_vllm's instances (exporter-services.json).
    cards = api(host, "/api/v1/query", query='dcu_card_health{job="dcu-exporter"}')["result"]
    assert sorted((int(r["metric"]["card"]), r["metric"]["service"], r["value"][1]) for r in cards) == [
        (card, f"vllm@{card}", "1") for card in range(CARDS)]


def card_readings(host) -> dict:
    """{card: (utilisation %, VRAM used / total)} as dcu-exporter publishes them now (its own /metrics)."""
    fetch = "import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=10).read().decode())"
    text = host.check_output(f"python3 -c {fetch!r} http://127.0.0.1:9400/metrics")
    values: dict = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in ("dcu_card_utilization_percent", "dcu_card_vram_used_bytes", "dcu_card_vram_total_bytes"):
            card = int(line.split('card="', 1)[1].split('"', 1)[0])
            values.setdefault(card, {})[name] = float(line.rsplit(" ", 1)[1])
    return {card: (v["dcu_card_utilization_percent"], v["dcu_card_vram_used_bytes"] / v["dcu_card_vram_total_bytes"])
            for card, v in values.items()}


def test_card_utilisation_follows_the_load_and_vllm_holds_its_vram_share(host, proxy_url):
    """The emulated driver counts each card's running sequences (docs/emulation.md): busy under load, idle after;
    VRAM used is the --gpu-memory-utilization (0.9) each instance took at start, load or not."""
    def readings_when(condition):
        return lambda: (lambda r: r if condition(r) else None)(card_readings(host))

    with steady_load(proxy_url, "MiniCPM-V-4.5", callers=8):
        busy = wait_until(readings_when(lambda r: sum(1 for u, _ in r.values() if u > 0) >= 4), 30, interval=0.5,
                          what="utilisation above 0 on at least 4 cards under 8 callers")
    assert sorted(busy) == list(range(CARDS))
    assert all(0.89 <= vram <= 0.91 for _, vram in busy.values()), busy
    idle = wait_until(readings_when(lambda r: all(u == 0 for u, _ in r.values())), 30, interval=0.5,
                      what="every card back to 0 % once the load stops")
    assert all(0.89 <= vram <= 0.91 for _, vram in idle.values()), idle


def test_prometheus_comes_from_the_bundle_and_runs_as_prometheus_on_loopback(host):
    assert host.check_output("dpkg-query --show --showformat='${Version}' prometheus") == "2.42.0+ds-5+deb12u1"
    assert host.check_output("systemctl show --property=User --value prometheus") == "prometheus"
    listening = host.check_output("ss -Hltn 'sport = :9090'")
    assert "127.0.0.1:9090" in listening and "*:9090" not in listening, listening
    assert "/etc/prometheus/dcu-serving.rules.yml" in api(host, "/api/v1/status/config")["yaml"]
    rules = api(host, "/api/v1/rules")["groups"][0]["rules"]
    assert [r["name"] for r in rules] == ["DCUCardMissing", "InstanceDown", "HostDown", "DCUDriverDown",
                                          "ProxyQueueGrowing", "ProxyErrorRatio", "BackendErrorRatio",
                                          "DCUVRAMNearFull"]


def test_alertmanager_comes_from_the_bundle_checked_by_amtool_with_its_secret_apart(host):
    assert host.check_output("dpkg-query --show --showformat='${Version}' prometheus-alertmanager") == "0.25.0-1+b4"
    assert host.check_output("systemctl show --property=User --value prometheus-alertmanager") == "prometheus"
    check = host.run("amtool check-config /etc/prometheus/alertmanager.yml")
    assert check.rc == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    listening = host.check_output("ss -Hltn 'sport = :9093 or sport = :9094'")
    assert "127.0.0.1:9093" in listening and ":9094" not in listening, listening  # no cluster port
    # Prometheus sends to it
    sent_to = api(host, "/api/v1/alertmanagers")["activeAlertmanagers"]
    assert [a["url"] for a in sent_to] == ["http://127.0.0.1:9093/api/v2/alerts"]
    # The token is in its own file, readable by the prometheus group only; the configuration names the file.
    token = "/etc/prometheus/alertmanager-secrets/webhook-0-operators-0.token"
    assert host.file(token).mode == 0o640 and host.file(token).group == "prometheus"
    assert "mol-pager-token" not in host.file("/etc/prometheus/alertmanager.yml").content_string
    assert token in host.file("/etc/prometheus/alertmanager.yml").content_string


def test_every_exporter_instance_and_proxy_is_scraped_with_up_1(host):
    expected = {("prometheus", ""): "1", ("dcu-exporter", ""): "1", ("dcu-proxy", ""): "1",
                **{("vllm", f"vllm@{card}"): "1" for card in range(CARDS)}}
    assert len(expected) == TARGETS
    wait_until(lambda: up_by_target(host) == expected, 60, interval=1,
               what=f"every target up == 1 (last: {up_by_target(host)})")
    targets = api(host, "/api/v1/targets")["activeTargets"]
    assert sorted(t["scrapeUrl"] for t in targets if t["labels"]["job"] == "vllm") == [
        f"http://127.0.0.1:{8002 + card}/metrics" for card in range(CARDS)]
    assert all(t["health"] == "up" for t in targets), [(t["scrapeUrl"], t["lastError"]) for t in targets]


def test_a_stopped_instance_fires_instance_down_naming_its_unit(host):
    def firing():
        return [a["labels"] for a in api(host, "/api/v1/alerts")["alerts"]
                if a["labels"]["alertname"] == "InstanceDown" and a["state"] == "firing"]

    # A quiet start: the serving tests before this one stop and restore instances (vllm@3's missing image), and
    # an alert stays firing until a rule evaluation after its target is back.
    wait_until(lambda: set(up_by_target(host).values()) == {"1"} and firing() == []
               and not alertmanager(host, "/alerts", filter='alertname="InstanceDown"'), 120, interval=1,
               what="every target up and no InstanceDown firing, in Prometheus and in Alertmanager")
    before = len(notifications(host))
    asked, asked_at = time.monotonic(), datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    host.run_expect([0], "systemctl stop vllm@1")  # returns once the container is gone
    stopped = time.monotonic()
    try:
        # 2s scrapes and evaluations, for: 6s (host_vars/node.yml)
        alerts = wait_until(firing, 90, interval=1, what="InstanceDown firing for vllm@1")
        fired = time.monotonic()
        assert [(a["job"], a["unit"], a["host"], a["severity"]) for a in alerts] == [
            ("vllm", "vllm@1", "node", "critical")]
        # ... and delivered to the pager (Alertmanager's group_wait: 1s), as one notification of one alert
        delivered = wait_until(lambda: alerts_in(notifications(host)[before:], alertname="InstanceDown"), 60,
                               interval=0.5, what="InstanceDown of vllm@1 at the pager")
        arrived = time.monotonic()
        print(f"InstanceDown fired {fired - asked:.1f}s and reached the pager {arrived - asked:.1f}s after "
              f"`systemctl stop vllm@1` was run (which took {stopped - asked:.1f}s)")
    finally:
        host.run_expect([0], "systemctl start vllm@1")
    wait_until(lambda: up_by_target(host).get(("vllm", "vllm@1")) == "1", 180, interval=1, what="vllm@1 up again")
    wait_until(lambda: firing() == [], 60, interval=1, what="InstanceDown resolved")
    wait_until(lambda: alerts_in(notifications(host)[before:], "resolved", alertname="InstanceDown", unit="vllm@1"),
               60, interval=0.5, what="the pager told that vllm@1 is back")
    notes = notifications(host)[before:]
    resolved = alerts_in(notes, "resolved", alertname="InstanceDown")
    assert [note["authorized"] for note in notes] == [True] * len(notes)  # the inventory's bearer token
    # One alert paged: the first notification holds it alone, and no other alert fired meanwhile. (A notification
    # of its group may repeat it alongside an earlier test's alert that resolved: Alertmanager sends a group whole.)
    paged = {(a["labels"]["alertname"], a["labels"].get("unit"), a["startsAt"]) for _, a in alerts_in(notes)}
    assert len(paged) == 1 and next(iter(paged))[:2] == ("InstanceDown", "vllm@1"), paged
    # The first notification fires vllm@1's alert alone. Alertmanager sends a group whole: the resolution of an alert
    # that resolved before this test began may ride along in it (vllm@5's, fired during the converge, did on
    # 2026-12-06). Only that, never another alert firing.
    first = notes[delivered[0][0]]["notification"]["alerts"]
    assert [(a["labels"]["unit"], a["status"]) for a in first if a["status"] == "firing"] == [("vllm@1", "firing")], \
        first
    assert all(a["status"] == "resolved" and a["endsAt"][:19] < asked_at for a in first
               if a["labels"]["unit"] != "vllm@1"), (asked_at, first)
    assert delivered[0][1]["annotations"]["summary"] == "vllm vllm@1 on node is down"
    assert "vllm@1" in [a["labels"]["unit"] for _, a in resolved], resolved
    # Alertmanager sends a group whole: the resolution of an earlier test's alert may ride along with this one's,
    # never an alert that fired or resolved during this test.
    earlier = [a for _, a in resolved if a["labels"]["unit"] != "vllm@1"]
    assert all(a["endsAt"][:19] < asked_at for a in earlier), (asked_at, earlier)


def test_a_dead_host_pages_once_and_a_stopped_driver_once(host):
    """Alertmanager's inhibitions on the alerts Prometheus would send: for ghost-a, a host that is down, its HostDown
    and the InstanceDown and DCUCardMissing of its 8 cards; for ghost-b, whose driver stopped, its DCUDriverDown, its
    8 cards' DCUCardMissing, its 8 instances' InstanceDown - and its proxy's InstanceDown, which the driver does not
    explain. The pager gets HostDown, DCUDriverDown and the proxy's InstanceDown; Alertmanager holds the rest back,
    naming the alert that explains each."""
    labels = []
    for card in range(CARDS):
        labels += [{"alertname": "InstanceDown", "job": "vllm", "unit": f"vllm@{card}", "severity": "critical"},
                   {"alertname": "DCUCardMissing", "card": str(card), "severity": "critical"}]
    ghost_a = [{"alertname": "HostDown", "severity": "critical"}, *labels]
    ghost_b = [{"alertname": "DCUDriverDown", "severity": "critical"},
               {"alertname": "InstanceDown", "job": "dcu-proxy", "severity": "critical"}, *labels]
    sent = [{**lab, "host": "ghost-a"} for lab in ghost_a] + [{**lab, "host": "ghost-b"} for lab in ghost_b]
    before = len(notifications(host))
    alertmanager(host, "/alerts", "POST", [{"labels": lab, "annotations": {"summary": "test"}} for lab in sent])

    def paged():
        return sorted((a["labels"]["host"], a["labels"]["alertname"], a["labels"].get("job", ""))
                      for _, a in alerts_in(notifications(host)[before:]))
    expected = [("ghost-a", "HostDown", ""), ("ghost-b", "DCUDriverDown", ""), ("ghost-b", "InstanceDown", "dcu-proxy")]
    wait_until(lambda: paged() == expected, 30, interval=0.5, what=f"{expected} at the pager (last: {paged()})")
    held_back = alertmanager(host, "/alerts", filter='host=~"ghost-.*"')
    state = {(a["labels"]["host"], a["labels"]["alertname"], a["labels"].get("job", ""), a["labels"].get("unit", ""),
              a["labels"].get("card", "")): a["status"] for a in held_back}
    assert len(state) == len(sent)
    held = {key: s for key, s in state.items() if s["state"] == "suppressed"}
    assert len(held) == 4 * CARDS and all(s["inhibitedBy"] for s in held.values()), held
    assert paged() == expected, "an inhibited alert reached the pager"
    # resolved now: they leave the next tests' pager quiet
    now = datetime.now(UTC)
    alertmanager(host, "/alerts", "POST", [{"labels": lab, "annotations": {"summary": "test"},
                                            "startsAt": (now - timedelta(minutes=5)).isoformat(),
                                            "endsAt": now.isoformat()} for lab in sent])


def test_check_mode_on_the_converged_node_changes_nothing(host, run_playbook, recap):
    rc, out = run_playbook("monitoring.yml", "--check", "--diff")
    assert rc == 0, out[-3000:]
    assert recap(out, "node")["changed"] == 0, out[-3000:]
