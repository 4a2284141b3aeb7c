"""dcu-exporter on both network-less nodes (converge.yml ends with playbooks/monitoring.yml): on `air`, whose proxy
runs in a container, from that container's image; on `air-host` from the proxy's venv. Each serves its two
cards with health 1, labelled with the unit of the instance on the card."""

from __future__ import annotations

import json

testinfra_hosts = ["air", "air-host"]
CARDS = 2


def metrics(host) -> str:
    fetch = "import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=10).read().decode())"
    return host.check_output(f"python3 -c {fetch!r} http://127.0.0.1:9400/metrics")


def test_the_exporter_serves_each_card_healthy_with_its_unit(host):
    assert host.service("dcu-exporter").is_running and host.service("dcu-exporter").is_enabled
    health = sorted(line for line in metrics(host).splitlines() if line.startswith("dcu_card_health{"))
    assert len(health) == CARDS, health
    for card, line in enumerate(health):
        assert f'card="{card}"' in line and f'service="vllm@{card}"' in line and line.endswith(" 1.0"), line


def test_on_a_container_proxy_host_it_runs_from_the_proxys_image_as_its_own_user(host):
    if host.backend.get_hostname() != "air":
        assert not host.exists("docker") or host.run("docker inspect dcu-exporter").rc != 0  # the venv's exporter
        assert host.check_output("systemctl show --property=User --value dcu-exporter") == "dcu-exporter"
        return
    box = json.loads(host.check_output("docker inspect dcu-exporter"))[0]
    proxy = json.loads(host.check_output("docker inspect dcu-proxy"))[0]
    assert box["Image"] == proxy["Image"]  # one bundle, one code
    uid, gid = host.check_output("id -u dcu-exporter"), host.check_output("id -g dcu-exporter")
    assert box["Config"]["User"] == f"{uid}:{gid}"
    config = box["HostConfig"]
    render_gid = host.check_output("stat -c %g /dev/dri/renderD128")
    assert render_gid in config["GroupAdd"], config["GroupAdd"]  # the node's group, by number
    assert config["ReadonlyRootfs"] is True and config["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in config["SecurityOpt"] and "seccomp=unconfined" in config["SecurityOpt"]
    assert {d["PathOnHost"] for d in config["Devices"]} >= {"/dev/kfd", "/dev/dri/renderD128", "/dev/dri/renderD129"}
    assert "/opt/hyhal:/opt/hyhal:ro" in config["Binds"]
