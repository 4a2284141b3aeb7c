"""dcu_prometheus' generated configuration, its alerts and its Grafana dashboard, without a host: the role's
templates rendered by ansible-playbook for a two-host inventory (inventory.yml, render.yml), then checked by
promtool (check config, check rules, and `test rules`: each alert fires on its condition and not otherwise)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DASHBOARD = ROOT / "roles" / "dcu_prometheus" / "files" / "dcu-serving-dashboard.json"


def playbook(name: str, *args: str) -> subprocess.CompletedProcess:
    """ansible-playbook tests/monitoring/<name> against the two-host inventory, on the controller."""
    bindir = Path(sys.executable).parent
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PATH=f"{bindir}:{os.environ['PATH']}",
               ANSIBLE_NOCOLOR="1")
    argv = [str(bindir / "ansible-playbook"), "-i", str(HERE / "inventory.yml"), str(HERE / name), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prometheus")
    proc = playbook("render.yml", "-e", f"out={out}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.mark.parametrize(("extra", "task", "says"), [
    ({"dcu_prometheus_listen": "9090"}, "Export where Prometheus answers",
     "dcu_prometheus_listen is '9090': give HOST:PORT"),
    ({"dcu_prometheus_hosts": []}, "Check the settings and what the serving hosts export",
     "dcu_prometheus_hosts is empty"),
])
def test_bad_settings_stop_the_role_at_its_first_tasks_naming_the_variable(extra, task, says):
    proc = playbook("role.yml", "-e", json.dumps(extra))
    assert proc.returncode != 0
    assert f"TASK [dcu.serving.dcu_prometheus : {task}]" in proc.stdout, proc.stdout[-2000:]
    assert says in proc.stdout, proc.stdout[-2000:]
    assert "Read the bundle index" not in proc.stdout


def test_hosts_whose_roles_exported_nothing_are_named_with_how_to_have_them_exported():
    """node-c's roles exported nothing in the run (it is no serving host of the inventory)."""
    proc = playbook("role.yml", "-e", json.dumps({"dcu_prometheus_hosts": ["node-a", "node-c"]}))
    assert proc.returncode != 0
    assert "dcu_monitoring_exporter_public_url of node-c is unknown in this run: dcu_monitoring exports it" \
        in proc.stdout, proc.stdout[-2000:]
    assert "run the playbook without --limit" in proc.stdout


def test_every_exporter_instance_and_proxy_of_the_inventory_is_scraped(rendered):
    config = yaml.safe_load((rendered / "prometheus.yml").read_text())
    jobs = {job["job_name"]: [(target, group.get("labels", {})) for group in job["static_configs"]
                              for target in group["targets"]] for job in config["scrape_configs"]}
    # node-a runs Prometheus: scraped on loopback; node-b at its ansible_host, on the ports its inventory gives.
    assert jobs["dcu-exporter"] == [("127.0.0.1:9400", {"host": "node-a"}), ("10.0.0.12:9400", {"host": "node-b"})]
    assert jobs["dcu-proxy"] == [("127.0.0.1:8000", {"host": "node-a"}), ("10.0.0.12:8080", {"host": "node-b"})]
    assert jobs["vllm"] == [("127.0.0.1:8002", {"host": "node-a", "unit": "vllm@0"}),
                            ("127.0.0.1:8003", {"host": "node-a", "unit": "vllm@1"}),
                            ("10.0.0.12:8002", {"host": "node-b", "unit": "vllm@0"})]
    assert jobs["prometheus"] == [("127.0.0.1:9090", {})]
    assert config["rule_files"] == [str(rendered / "dcu-serving.rules.yml")]
    # Alerts go to the Alertmanager dcu_alertmanager runs beside it (its export dcu_alertmanager_url).
    assert config["alerting"] == {"alertmanagers": [{"scheme": "http",
                                                     "static_configs": [{"targets": ["127.0.0.1:9093"]}]}]}


def test_promtool_accepts_the_configuration_and_the_rules(promtool, rendered):
    rules = subprocess.run([promtool, "check", "rules", str(rendered / "dcu-serving.rules.yml")],
                           capture_output=True, text=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS: 8 rules found" in rules.stdout
    config = subprocess.run([promtool, "check", "config", str(rendered / "prometheus.yml")],
                            capture_output=True, text=True)
    assert config.returncode == 0, config.stdout + config.stderr


# promtool's rule unit tests: series over time, and the alerts expected at given times (with their labels).
ALERT_TESTS = {
    "rule_files": ["summaries.rules.yml"],
    "evaluation_interval": "15s",
    "tests": [
        {  # vllm@1 stops answering: InstanceDown after 2m (its `for`), naming the unit; vllm@0 stays quiet
            "interval": "15s",
            "input_series": [
                {"series": 'up{job="vllm", instance="127.0.0.1:8002", host="node-a", unit="vllm@0"}',
                 "values": "1x20"},
                {"series": 'up{job="vllm", instance="127.0.0.1:8003", host="node-a", unit="vllm@1"}',
                 "values": "1 0x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "InstanceDown", "exp_alerts": []},
                {"eval_time": "3m", "alertname": "InstanceDown", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "job": "vllm", "instance": "127.0.0.1:8003",
                                    "host": "node-a", "unit": "vllm@1"},
                     "exp_annotations": {"summary": 'vllm vllm@1 on node-a is down'}}]},
            ],
        },
        {  # node-b must show 4 cards and shows 3; node-a's card 1 is unbound (health 0)
            "interval": "1m",
            "input_series": [
                {"series": 'dcu_cards{host="node-b"}', "values": "3x10"},
                {"series": 'dcu_cards{host="node-a"}', "values": "2x10"},
                {"series": 'dcu_card_health{host="node-a", card="0", pci="0000:07:00.0"}',
                 "values": "1x10"},
                {"series": 'dcu_card_health{host="node-a", card="1", pci="0000:0a:00.0"}',
                 "values": "0x10"},
            ],
            "alert_rule_test": [
                {"eval_time": "6m", "alertname": "DCUCardMissing", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "host": "node-a", "card": "1",
                                    "pci": "0000:0a:00.0"},
                     "exp_annotations": {"summary": 'DCU card 1 on node-a is unhealthy'}},
                    {"exp_labels": {"severity": "critical", "host": "node-b"},
                     "exp_annotations": {"summary": 'node-b shows only 3 DCU cards'}}]},
            ],
        },
        {  # node-b: every target down -> one HostDown (with its InstanceDowns, which Alertmanager holds back);
           # node-a: one instance down -> no HostDown
            "interval": "15s",
            "input_series": [
                {"series": 'up{job="dcu-exporter", instance="10.0.0.12:9400", host="node-b"}', "values": "1 0x20"},
                {"series": 'up{job="dcu-proxy", instance="10.0.0.12:8080", host="node-b"}', "values": "1 0x20"},
                {"series": 'up{job="vllm", instance="10.0.0.12:8002", host="node-b", unit="vllm@0"}',
                 "values": "1 0x20"},
                {"series": 'up{job="dcu-exporter", instance="127.0.0.1:9400", host="node-a"}', "values": "1x20"},
                {"series": 'up{job="vllm", instance="127.0.0.1:8002", host="node-a", unit="vllm@0"}',
                 "values": "1 0x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "HostDown", "exp_alerts": []},
                {"eval_time": "3m", "alertname": "HostDown", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "host": "node-b"},
                     "exp_annotations": {"summary": "node-b is down: Prometheus reaches none of its services"}}]},
            ],
        },
        {  # node-a: hy-smi stops answering, every card goes to health 0 -> one DCUDriverDown (before the cards'
           # own DCUCardMissing at 5m); node-b: one card of two unhealthy -> no DCUDriverDown
            "interval": "15s",
            "input_series": [
                {"series": 'dcu_card_health{host="node-a", card="0", pci="p0"}', "values": "1 0x40"},
                {"series": 'dcu_card_health{host="node-a", card="1", pci="p1"}', "values": "1 0x40"},
                {"series": 'dcu_card_health{host="node-b", card="0", pci="p0"}', "values": "1x40"},
                {"series": 'dcu_card_health{host="node-b", card="1", pci="p1"}', "values": "1 0x40"},
            ],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "DCUDriverDown", "exp_alerts": []},
                {"eval_time": "3m", "alertname": "DCUDriverDown", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "host": "node-a"},
                     "exp_annotations": {
                         "summary": "No DCU card of node-a is healthy: the driver or hy-smi is down"}}]},
                {"eval_time": "3m", "alertname": "DCUCardMissing", "exp_alerts": []},
            ],
        },
        {  # vllm@1 on node-a answers 10% of its requests with errors (9 successes, 1 error a minute); vllm@0 none:
           # only vllm@1 alerts, named by its unit (the proxy's backend 127.0.0.1:8003 is the instance on port 8003)
            "interval": "1m",
            "input_series": [
                {"series": 'dcu_proxy_backend_errors_total{job="dcu-proxy", host="node-a", backend="127.0.0.1:8003", '
                           'model="m"}', "values": "0+1x20"},
                {"series": 'vllm:request_success_total{job="vllm", host="node-a", instance="127.0.0.1:8003", '
                           'unit="vllm@1", finished_reason="stop", model_name="m"}', "values": "0+9x20"},
                {"series": 'vllm:request_success_total{job="vllm", host="node-a", instance="127.0.0.1:8002", '
                           'unit="vllm@0", finished_reason="stop", model_name="m"}', "values": "0+10x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": "BackendErrorRatio", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "host": "node-a", "port": "8003", "unit": "vllm@1"},
                     "exp_annotations": {
                         "summary": "vllm@1 on node-a answers 10% of its requests with errors"}}]},
            ],
        },
        {  # the queue grows past 20 and keeps growing for 10m; a steady queue of 50 does not alert
            "interval": "1m",
            "input_series": [
                {"series": 'dcu_proxy_queue_depth{host="node-a"}', "values": "0+5x30"},
                {"series": 'dcu_proxy_queue_depth{host="node-b"}', "values": "50x30"},
            ],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "ProxyQueueGrowing", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "host": "node-a"},
                     "exp_annotations": {"summary": "dcu-proxy's queue on node-a keeps growing (100 waiting)"}}]},
            ],
        },
        {  # node-a answers 10% of its requests with 502, node-b 1%: only node-a alerts
            "interval": "1m",
            "input_series": [
                {"series": 'dcu_proxy_requests_total{host="node-a", api="chat", model="m", status="200"}',
                 "values": "0+90x20"},
                {"series": 'dcu_proxy_requests_total{host="node-a", api="chat", model="m", status="502"}',
                 "values": "0+10x20"},
                {"series": 'dcu_proxy_requests_total{host="node-b", api="chat", model="m", status="200"}',
                 "values": "0+99x20"},
                {"series": 'dcu_proxy_requests_total{host="node-b", api="chat", model="m", status="502"}',
                 "values": "0+1x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": "ProxyErrorRatio", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "host": "node-a"},
                     "exp_annotations": {"summary": "10% of dcu-proxy's answers on node-a are errors"}}]},
            ],
        },
        {  # card 0 at 98% of its VRAM for 10m alerts; card 1 at vLLM's usual 90% does not
            "interval": "1m",
            "input_series": [
                {"series": 'dcu_card_vram_used_bytes{host="node-a", card="0", pci="p0", service="m"}',
                 "values": "98x20"},
                {"series": 'dcu_card_vram_total_bytes{host="node-a", card="0", pci="p0", service="m"}',
                 "values": "100x20"},
                {"series": 'dcu_card_vram_used_bytes{host="node-a", card="1", pci="p1", service="m"}',
                 "values": "90x20"},
                {"series": 'dcu_card_vram_total_bytes{host="node-a", card="1", pci="p1", service="m"}',
                 "values": "100x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "DCUVRAMNearFull", "exp_alerts": []},
                {"eval_time": "15m", "alertname": "DCUVRAMNearFull", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "host": "node-a", "card": "0",
                                    "pci": "p0", "service": "m"},
                     "exp_annotations": {"summary": 'VRAM of card 0 on node-a is 98% used'}}]},
            ],
        },
    ],
}


def test_each_alert_fires_on_its_condition_and_only_then(promtool, rendered):
    """With the summary an operator reads (descriptions left out of this copy: promtool compares every one)."""
    rules = yaml.safe_load((rendered / "dcu-serving.rules.yml").read_text())
    for rule in rules["groups"][0]["rules"]:
        del rule["annotations"]["description"]
    (rendered / "summaries.rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    tests = rendered / "alerts.test.yml"
    tests.write_text(yaml.safe_dump(ALERT_TESTS, sort_keys=False))
    proc = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True, cwd=rendered)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _sample_names(families) -> set[str]:
    """The names a scrape shows for these metric families (a counter's _total, a histogram's _bucket...)."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "summary": ["_sum", "_count"]}
    return {family.name + suffix for family in families for suffix in suffixes.get(family.type, [""])}


def _known_metrics() -> set[str]:
    from dcu_serving.exporter.collector import CardCollector, HySmi
    from dcu_serving.proxy.metrics import Metrics as ProxyMetrics
    from dcu_serving.sim.metrics import Metrics as SimMetrics

    exporter = CardCollector(HySmi("/nonexistent/hy-smi", 1.0)).describe()
    proxy = ProxyMetrics(type("Proxy", (), {"balancer": None, "relay": None, "mineru": None})()).collect()
    sim = SimMetrics("m").registry.collect()
    registry = CollectorRegistry()  # Prometheus' own series: up, ALERTS
    return _sample_names([*exporter, *proxy, *sim, *registry.collect()]) | {"up", "ALERTS"}


def _metrics_in(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers not followed by '(' that are not keywords, labels or
    label values (strings dropped first)."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    names = {m.group() for m in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
             if not expr[m.end():].lstrip().startswith("(")}  # a function's name, or an aggregation's
    return names - {"and", "or", "unless", "bool", "offset", "group_left", "group_right"}


def test_the_dashboard_imports_and_queries_metrics_that_exist():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["__inputs"][0]["type"] == "datasource"  # Grafana's import asks for the Prometheus
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Overview", "Cards", "Services (vLLM instances)", "Proxy"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    known = _known_metrics()
    used = set()
    for panel in panels:
        for target in panel["targets"]:
            names = _metrics_in(target["expr"])
            assert names, (panel["title"], target["expr"])
            assert names <= known, (panel["title"], sorted(names - known))
            used |= names
    # Every family of the three sources that matters to an operator is on it.
    for name in ("dcu_card_utilization_percent", "dcu_card_vram_used_bytes", "dcu_card_temperature_celsius",
                 "dcu_card_power_watts", "dcu_card_health", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "dcu_proxy_requests_total", "dcu_proxy_queue_depth", "dcu_proxy_backend_healthy"):
        assert name in used, name


def test_the_alerts_query_metrics_that_exist(rendered):
    rules = yaml.safe_load((rendered / "dcu-serving.rules.yml").read_text())["groups"][0]["rules"]
    known = _known_metrics()
    for rule in rules:
        names = _metrics_in(rule["expr"])
        assert names and names <= known, (rule["alert"], sorted(names - known))


def test_the_dashboards_metric_check_catches_a_misspelt_name():
    assert _metrics_in('rate(vllm:generation_tokens_totl{host=~"$host"}[1m])') - _known_metrics() == {
        "vllm:generation_tokens_totl"}
