"""Nodes without any network served after site.yml: the play needed nothing from outside."""

from __future__ import annotations

import json

import pytest

testinfra_hosts = ["air", "air-host"]
CARDS = 2


def cluster_health(host, **args):
    try:
        return host.ansible("dcu.serving.cluster_health", " ".join(f"{k}={v}" for k, v in args.items()),
                            check=False, become=True)
    except host.ansible.AnsibleException as exc:
        pytest.fail(str(exc.result.get("msg")))


def test_the_node_has_no_network_but_loopback(host):
    # docker0 is the node's own Docker bridge (inside the node, connected to nothing).
    links = json.loads(host.check_output("ip -json link show"))
    assert [link["ifname"] for link in links if link["ifname"] != "docker0"] == ["lo"]
    assert "default" not in host.check_output("ip route show")
    outside = host.run("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 443), timeout=3)'")
    assert outside.rc != 0 and "unreachable" in outside.stderr.lower()


def test_every_card_serves_behind_the_proxy_and_answers_a_request(host):
    result = cluster_health(host, expected=CARDS, check_backends="true", functional_request="true",
                            orid="airgap-verify", timeout=60)
    assert result["summary"] == f"{CARDS}/{CARDS}"
    assert result["functional"]["status"] == 200
    assert result["functional"]["backend"] in {f"127.0.0.1:{8002 + card}" for card in range(CARDS)}


def test_the_proxy_came_from_the_bundle(host):
    assert host.service("dcu-proxy").is_running
    if host.backend.get_hostname() == "air":  # runtime container: the bundle's proxy image
        assert "dcu-serving/proxy:0.1.0" in host.check_output("docker image ls --format '{{.Repository}}:{{.Tag}}'")
    else:  # runtime venv (auto): the bundle's wheels
        assert host.file("/opt/dcu-serving/venv/bundle-requirements.txt").contains("--hash=sha256:")
