"""testinfra checks of monitoring on the emulated node (converge.yml ends with playbooks/monitoring.yml):
dcu-exporter as its own user, Prometheus installed from the bundle with no package source, every scrape target
up, and a stopped instance's alert, all read through Prometheus' HTTP API on the node (it listens on loopback)."""

from __future__ import annotations

import json
import time
import urllib.parse

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
    assert [r["name"] for r in rules] == ["DCUCardMissing", "InstanceDown", "ProxyQueueGrowing", "ProxyErrorRatio",
                                          "DCUVRAMNearFull"]


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
    wait_until(lambda: set(up_by_target(host).values()) == {"1"} and firing() == [], 120, interval=1,
               what="every target up and no InstanceDown firing")
    asked = time.monotonic()
    host.run_expect([0], "systemctl stop vllm@1")  # returns once the container is gone
    stopped = time.monotonic()
    try:
        # 2s scrapes and evaluations, for: 6s (host_vars/node.yml)
        alerts = wait_until(firing, 90, interval=1, what="InstanceDown firing for vllm@1")
        print(f"InstanceDown fired {time.monotonic() - asked:.1f}s after `systemctl stop vllm@1` was run "
              f"(which took {stopped - asked:.1f}s)")
        assert [(a["job"], a["unit"], a["host"], a["severity"]) for a in alerts] == [
            ("vllm", "vllm@1", "node", "critical")]
    finally:
        host.run_expect([0], "systemctl start vllm@1")
    wait_until(lambda: up_by_target(host).get(("vllm", "vllm@1")) == "1", 180, interval=1, what="vllm@1 up again")
    wait_until(lambda: firing() == [], 60, interval=1, what="InstanceDown resolved")


def test_check_mode_on_the_converged_node_changes_nothing(host, run_playbook, recap):
    rc, out = run_playbook("monitoring.yml", "--check", "--diff")
    assert rc == 0, out[-3000:]
    assert recap(out, "node")["changed"] == 0, out[-3000:]
