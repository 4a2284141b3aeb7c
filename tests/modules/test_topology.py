"""The fleet's wiring from what each role exports (plugin_utils/topology.py): Prometheus' targets, the cards each
host must show, the gateway's hosts - every port and address read from the owning role's export, never from a
copy of its default; a host that exported nothing, or that listens where the reader cannot reach it, is named."""

from __future__ import annotations

import re

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.plugin_utils import topology
from ansible_collections.dcu.serving.plugins.plugin_utils.topology import (
    gateway_hosts,
    gateway_trust,
    prometheus_expected_cards,
    prometheus_targets,
    proxy_backends,
    proxy_mineru,
)


def exported(address, proxy_port=8000, exporter="127.0.0.1:9400", base_port=8002, cards=2, models=("m",)):
    """A serving host's facts as dcu_proxy, dcu_monitoring and dcu_vllm export them."""
    exporter_host, exporter_port = exporter.rsplit(":", 1)
    exporter_public = address if exporter_host in ("", "0.0.0.0") else exporter_host
    return {
        "ansible_host": address,
        "dcu_proxy_url": f"http://127.0.0.1:{proxy_port}", "dcu_proxy_public_url": f"http://{address}:{proxy_port}",
        "dcu_monitoring_exporter_url": f"http://{exporter_host.replace('0.0.0.0', '127.0.0.1') or '127.0.0.1'}"
                                       f":{exporter_port}",
        "dcu_monitoring_exporter_public_url": f"http://{exporter_public}:{exporter_port}",
        "dcu_vllm_instances": [{"unit": f"vllm@{n}", "port": base_port + n, "url": f"http://127.0.0.1:{base_port + n}",
                                "card": n, "cards": [n]} for n in range(cards)],
        "dcu_vllm_card_count": cards,
        "dcu_vllm_models": list(models),
        "dcu_vllm_model_kinds": {model: "embedding" if model == "bge" else "chat" for model in models},
    }


HOSTVARS = {
    "node-a": exported("10.0.0.11"),
    # every port moved off its default
    "node-b": exported("10.0.0.12", proxy_port=9000, exporter="0.0.0.0:9500", base_port=8100, cards=1,
                       models=("qwen", "bge")),
}


def test_prometheus_scrapes_its_own_host_on_loopback_and_the_others_where_they_listen():
    jobs = prometheus_targets(["node-a", "node-b"], HOSTVARS, "node-a")
    assert jobs == {
        "dcu-exporter": [{"targets": ["127.0.0.1:9400"], "labels": {"host": "node-a"}},
                         {"targets": ["10.0.0.12:9500"], "labels": {"host": "node-b"}}],
        "dcu-proxy": [{"targets": ["127.0.0.1:8000"], "labels": {"host": "node-a"}},
                      {"targets": ["10.0.0.12:9000"], "labels": {"host": "node-b"}}],
        "vllm": [{"targets": ["127.0.0.1:8002"], "labels": {"host": "node-a", "unit": "vllm@0"}},
                 {"targets": ["127.0.0.1:8003"], "labels": {"host": "node-a", "unit": "vllm@1"}},
                 {"targets": ["10.0.0.12:8100"], "labels": {"host": "node-b", "unit": "vllm@0"}}],
    }
    assert prometheus_expected_cards(["node-a", "node-b"], HOSTVARS) == {"node-a": 2, "node-b": 1}


def test_an_exporter_on_loopback_of_another_host_is_scraped_at_its_address_with_a_warning(monkeypatch):
    """dcu-exporter's default listens on loopback: from another host its target is down (its alert fires) as before,
    and the run says how to make it reachable."""
    warned = []
    monkeypatch.setattr(topology.display, "warning", warned.append)
    jobs = prometheus_targets(["node-a", "node-b"], HOSTVARS, "node-b")
    assert jobs["dcu-exporter"] == [{"targets": ["10.0.0.11:9400"], "labels": {"host": "node-a"}},
                                    {"targets": ["127.0.0.1:9500"], "labels": {"host": "node-b"}}]
    assert warned == ["dcu-exporter of node-a is http://127.0.0.1:9400: it listens on loopback only, so Prometheus on "
                      "node-b cannot scrape it at 10.0.0.11:9400; make it listen where node-b reaches it (e.g. "
                      "dcu_monitoring_exporter_listen: 0.0.0.0:PORT) or run Prometheus on node-a"]


def test_a_host_whose_roles_exported_nothing_in_this_run_is_named():
    with pytest.raises(AnsibleFilterError, match="dcu_monitoring_exporter_public_url of node-c is unknown in this run: "
                                                 "dcu_monitoring exports it"):
        prometheus_targets(["node-a", "node-c"], dict(HOSTVARS, **{"node-c": {"ansible_host": "10.0.0.13"}}),
                           "node-a")
    with pytest.raises(AnsibleFilterError, match="dcu_vllm_card_count of node-c is unknown in this run"):
        prometheus_expected_cards(["node-c"], {"node-c": {}})


def test_the_gateway_reaches_each_proxy_where_it_listens_or_at_its_gateway_address():
    hostvars = dict(HOSTVARS, **{"node-b": dict(HOSTVARS["node-b"], dcu_gateway_address="192.168.7.12")})
    assert gateway_hosts(["node-a", "node-b"], hostvars) == [
        {"name": "node-a", "url": "http://10.0.0.11:8000", "models": ["m"], "kinds": {"m": "chat"}},
        {"name": "node-b", "url": "http://192.168.7.12:9000", "models": ["qwen", "bge"],
         "kinds": {"qwen": "chat", "bge": "embedding"}},
    ]


def test_a_host_whose_proxy_is_minerus_entrance_says_so_to_the_gateway_with_its_limit():
    entrance = {"url": "http://127.0.0.1:8010", "max_upload_mb": 50, "concurrency": 2, "queue_size": 16,
                "timeout": 1800}
    hostvars = dict(HOSTVARS, **{"node-a": dict(HOSTVARS["node-a"], dcu_mineru_proxy_entrance=entrance),
                                 "node-b": dict(HOSTVARS["node-b"], dcu_mineru_proxy_entrance={})})  # own port only
    got = gateway_hosts(["node-a", "node-b"], hostvars)
    assert got[0]["mineru"] == {"max_upload_mb": 50, "timeout": 1800}
    assert "mineru" not in got[1]


def test_a_proxy_behind_a_gateway_with_tls_is_reached_and_scraped_over_https():
    tls = dict(HOSTVARS["node-b"], dcu_proxy_public_url="https://10.0.0.12:8443", dcu_gateway_address="192.168.7.12")
    hostvars = dict(HOSTVARS, **{"node-b": tls})
    assert gateway_hosts(["node-b"], hostvars) == [
        {"name": "node-b", "url": "https://192.168.7.12:8443", "models": ["qwen", "bge"],
         "kinds": {"qwen": "chat", "bge": "embedding"}}]
    jobs = prometheus_targets(["node-a", "node-b"], hostvars, "node-a")
    assert jobs["dcu-proxy"] == [{"targets": ["127.0.0.1:8000"], "labels": {"host": "node-a"}},
                                 {"targets": ["10.0.0.12:8443"], "labels": {"host": "node-b", "__scheme__": "https"}}]
    # on its own host Prometheus scrapes the plain loopback listener
    assert prometheus_targets(["node-b"], hostvars, "node-b")["dcu-proxy"] == [
        {"targets": ["127.0.0.1:9000"], "labels": {"host": "node-b"}}]


def test_a_proxy_on_loopback_cannot_be_a_gateways_host():
    hostvars = {"node-a": dict(HOSTVARS["node-a"], dcu_proxy_public_url="http://127.0.0.1:8000")}
    with pytest.raises(AnsibleFilterError, match="dcu-proxy of node-a listens on loopback only"):
        gateway_hosts(["node-a"], hostvars)
    with pytest.raises(AnsibleFilterError, match="dcu_proxy_public_url of node-z is unknown in this run"):
        gateway_hosts(["node-z"], {})


def test_proxy_backends_name_each_instances_models_kind_and_limits():
    instances = [{"url": "http://127.0.0.1:8002", "models": ["qwen", "qwen-chat"], "kind": "chat",
                  "max_num_seqs": 8, "max_model_len": 32768},
                 {"url": "http://127.0.0.1:8008", "model": "bge", "kind": "embedding"}]
    assert proxy_backends(instances) == [
        {"url": "http://127.0.0.1:8002", "models": ["qwen", "qwen-chat"], "kind": "chat", "concurrency": 8,
         "max_model_len": 32768},
        {"url": "http://127.0.0.1:8008", "models": ["bge"], "kind": "embedding"}]


def test_minerus_entrance_is_the_proxys_mineru_section_only_when_the_inventory_says_proxy():
    assert proxy_mineru("own", "127.0.0.1:8010", 100, 2, 16, 1800) == {}
    assert proxy_mineru("own", "0.0.0.0:8010", 100, 2, 16, 1800) == {}  # on its own port, as before
    assert proxy_mineru("proxy", "127.0.0.1:8011", "50", 3, 0, 600) == {
        "url": "http://127.0.0.1:8011", "max_upload_mb": 50, "concurrency": 3, "queue_size": 0, "timeout": 600}
    assert proxy_mineru("proxy", "[::1]:8010", 1, 1, 1, 1)["url"] == "http://[::1]:8010"


@pytest.mark.parametrize(("args", "message"), [
    (("nginx", "127.0.0.1:8010", 100, 2, 16, 1800), "dcu_mineru_entrance is 'nginx': choose own .* or proxy"),
    (("proxy", "0.0.0.0:8010", 100, 2, 16, 1800),
     "dcu_mineru_entrance is proxy but dcu_mineru_listen 0.0.0.0:8010 takes calls from the network.*set "
     "dcu_mineru_listen to 127.0.0.1:8010, or dcu_mineru_entrance: own"),
    (("proxy", "8010", 100, 2, 16, 1800), "dcu_mineru_listen is '8010': give HOST:PORT"),
    (("proxy", "127.0.0.1:8010", 100, 0, 16, 1800), "dcu_mineru_workers is 0: give a whole number of at least 1"),
    (("proxy", "127.0.0.1:8010", 100, 2, -1, 1800), "dcu_mineru_entrance_queue is -1: .* at least 0"),
    (("proxy", "127.0.0.1:8010", 100, 2, 16, "soon"), "dcu_mineru_parse_timeout is 'soon'"),
])
def test_a_bad_entrance_setting_is_refused_naming_the_variable(args, message):
    with pytest.raises(AnsibleFilterError, match=message):
        proxy_mineru(*args)


# --- who a serving host behind a gateway answers ---------------------------------------------------------------------

SECRET = "gw-proxy-secret-0123456789"


def test_a_serving_host_trusts_the_gateways_addresses_and_secret_and_names_their_url():
    hostvars = {"gw1": {"ansible_host": "10.20.0.5", "dcu_gateway_proxy_secret": SECRET},
                "gw2": {"ansible_host": "gw2.example", "dcu_gateway_source_addresses": ["10.20.0.6", "10.30.0.0/24"],
                        "dcu_gateway_listen": "0.0.0.0:4443", "dcu_gateway_proxy_secret": SECRET}}
    # HTTPS unless the gateways' TLS is off (dcu_gateway_tls defaults to site); the hosts follow their TLS setting
    assert gateway_trust(["gw1", "gw2"], hostvars, "0.0.0.0:4000") == {
        "url": "https://10.20.0.5:4000 or https://gw2.example:4443",
        "allow": ["10.20.0.5", "10.20.0.6", "10.30.0.0/24"], "secret": SECRET,
        "tls": "site", "tls_lab_dir": None, "tls_ca": ""}
    plain = {name: dict(facts, dcu_gateway_tls="off") for name, facts in hostvars.items()}
    assert gateway_trust(["gw1", "gw2"], plain)["url"] == "http://10.20.0.5:4000 or http://gw2.example:4443"
    assert gateway_trust(["gw1", "gw2"], plain)["tls"] == "off"
    # two gateways behind one floating address: callers are sent there, once
    both = {name: dict(facts, dcu_gateway_vip="10.20.0.100", ansible_host=address, dcu_gateway_tls="lab",
                       dcu_gateway_tls_lab_dir="/srv/inventory/tls")
            for name, facts, address in (("gw1", hostvars["gw1"], "10.20.0.5"), ("gw2", hostvars["gw1"], "10.20.0.6"))}
    assert gateway_trust(["gw1", "gw2"], both) == {"url": "https://10.20.0.100:4000",
                                                   "allow": ["10.20.0.5", "10.20.0.6"], "secret": SECRET,
                                                   "tls": "lab", "tls_lab_dir": "/srv/inventory/tls", "tls_ca": ""}
    hostvars["gw1"]["dcu_gateway_public_url"] = "https://llm.example.internal"
    assert gateway_trust(["gw1"], hostvars)["url"] == "https://llm.example.internal"
    assert gateway_trust([], hostvars) == {}


def test_gateways_with_different_tls_settings_are_refused():
    hostvars = {"gw1": {"ansible_host": "10.0.0.5", "dcu_gateway_proxy_secret": SECRET},
                "gw2": {"ansible_host": "10.0.0.6", "dcu_gateway_proxy_secret": SECRET, "dcu_gateway_tls": "off"}}
    with pytest.raises(AnsibleFilterError, match=re.escape("dcu_gateway_tls differs between the gateways (gw1 site, "
                                                           "gw2 off)")):
        gateway_trust(["gw1", "gw2"], hostvars)


@pytest.mark.parametrize(("facts", "message"), [
    ({"ansible_host": "gw1.example"}, "its ansible_host 'gw1.example' is not an IP address; set "
                                     "dcu_gateway_source_addresses in its host vars"),
    ({"dcu_gateway_source_addresses": "10.0.0.5"}, "dcu_gateway_source_addresses of gw1: a non-empty list"),
    ({"dcu_gateway_source_addresses": ["gw.example"]}, "'gw.example' is not an IP address or network"),
    ({"ansible_host": "10.0.0.5", "dcu_gateway_proxy_secret": "short"}, "dcu_gateway_proxy_secret of the gateway gw1: "
                                                                        "missing or shorter than 16 characters"),
])
def test_a_gateway_the_serving_hosts_cannot_tell_fails_the_play_naming_the_variable(facts, message):
    with pytest.raises(AnsibleFilterError, match=re.escape(message)):
        gateway_trust(["gw1"], {"gw1": dict({"dcu_gateway_proxy_secret": SECRET}, **facts)})


def test_gateways_with_different_secrets_are_refused():
    hostvars = {name: {"ansible_host": f"10.0.0.{i}", "dcu_gateway_proxy_secret": SECRET + str(i)}
                for i, name in enumerate(("gw1", "gw2"))}
    with pytest.raises(AnsibleFilterError, match="differs between the gateways gw1 and gw2"):
        gateway_trust(["gw1", "gw2"], hostvars)
