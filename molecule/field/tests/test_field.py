"""The BW OAM box after site.yml over SSH (converged twice): what an operator trying us on a real host would
check first. Tests run in file order; the ones that stop hymgr or break the inventory come last."""

from __future__ import annotations

import json

from testkit import PROJECT

testinfra_hosts = ["node"]
SYSFS = "/run/dcu-emu/sys"
# The profile's cards in hy-smi's (the driver's) order, with their NUMA nodes: not PCI order.
PROFILE = json.loads((PROJECT / "tools/images/node/files/profiles.json").read_text())["bw-oam"]
MAPPING = ("index", "pci_bus", "card_node", "render_node", "numa_node")


def test_the_operator_is_not_root_and_becomes_root_with_sudo(host):
    assert host.check_output("id -un") == "deploy"
    assert host.check_output("sudo -n id -un") == "root"
    assert host.check_output("systemctl is-active ssh") == "active"


def test_every_card_serves_behind_the_proxy(host):
    status = json.loads(host.check_output(
        "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://127.0.0.1:8000/__lb_status\").read().decode())'"))
    assert (status["healthy"], status["total"]) == (8, 8), status
    for card in range(8):
        assert host.service(f"vllm@{card}").is_running


def test_cards_are_the_same_in_every_source_mode_and_follow_hy_smi(host, dcu_module):
    views = {}
    for source in ("hy-smi-json", "hy-smi-text", "sysfs"):
        result = dcu_module(host, "dcu.serving.dcu_facts", sysfs_root=SYSFS, source=source)
        facts = result["ansible_facts"]["dcu"]
        assert facts["card_count"] == 8, (source, facts["errors"])
        assert facts["unbound"] == []
        assert facts["platform_functions"] >= 14, "the switch endpoints and the CPU's functions are not cards"
        views[source] = [[card[key] for key in MAPPING] for card in facts["cards"]]
    assert views["hy-smi-json"] == views["hy-smi-text"] == views["sysfs"]
    expected = [[i, bdf, f"/dev/dri/card{i}", f"/dev/dri/renderD{128 + i}", numa]
                for i, (bdf, numa) in enumerate(PROFILE["cards"])]
    assert views["sysfs"] == expected
    assert [row[1] for row in expected] != sorted(row[1] for row in expected), "PCI order is not the index"


def test_each_instance_is_on_the_card_of_its_index_as_vendor_images_need(host):
    for index, (bdf, _numa) in enumerate(PROFILE["cards"]):
        env = host.file(f"/etc/dcu-serving/vllm/{index}.env").content_string
        assert f"PCI {bdf}" in env and f"/dev/dri/renderD{128 + index}" in env
        inspect = json.loads(host.check_output(f"sudo docker inspect vllm-{index}"))[0]
        assert f"/dev/dri/renderD{128 + index}" in {d["PathOnHost"] for d in inspect["HostConfig"]["Devices"]}
        assert "seccomp=unconfined" in inspect["HostConfig"]["SecurityOpt"]
        # Each instance's vLLM-internal ports in a range of its own; nothing may try the hub.
        environment = set(inspect["Config"]["Env"])
        assert f"VLLM_PORT={20000 + 100 * index}" in environment
        assert {"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "VLLM_NO_USAGE_STATS=1"} <= environment


def test_the_service_user_opens_the_devices(host, dcu_module):
    result = dcu_module(host, "dcu.serving.dcu_device_access", user="dcu-serving", expected_cards=8,
                        sysfs_root=SYSFS)
    assert result["problems"] == [], result
    assert {node["group"] for node in result["nodes"] if "renderD" in node["path"]} == {"render"}


def test_the_driver_was_installed_once_and_recorded_by_its_installer(host):
    index = json.loads((PROJECT / "build/bundle/index.json").read_text())
    driver = next(a for a in index["artifacts"] if a["kind"] == "driver")
    record = json.loads(host.check_output("sudo cat /var/lib/dcu-serving/rock-install.json"))
    assert (record["sha256"], record["version"]) == (driver["sha256"], driver["version"])
    # The rpm-style package version differs from the installer's spelling, and the driver writes no version
    # file: the second converge (idempotence, changed=0) had neither to compare by string.
    assert record["package"] == {"name": "rock", "version": "6.3.30-1.4.1a"}
    assert not host.file(f"{SYSFS}/module/hycu/version").exists
    logs = host.check_output("sudo sh -c 'ls /var/log/dcu-serving/rock-install-*.log'").split()
    assert logs == [f"/var/log/dcu-serving/rock-install-{driver['version']}.log"]
    assert host.check_output("sudo grep -c 'Install successful' " + logs[0]) == "1"
    assert not host.file("/run/dcu-driver.reboot-required").exists


def test_a_card_count_the_host_does_not_have_fails_naming_every_card(run_playbook):
    rc, output = run_playbook("verify.yml", extra_vars={"dcu_vllm_expected_cards": 9})
    assert rc != 0
    assert "shows 8 DCU cards, dcu_vllm_expected_cards expects 9" in output
    for index, (bdf, _numa) in enumerate(PROFILE["cards"]):
        assert f"card {index} at {bdf} (BW): driver hycu, DRM card{index}+renderD{128 + index}" in output
    assert "Fix:" in output


def test_without_hymgr_hy_smi_fails_and_the_facts_say_so(host, dcu_module):
    host.run("sudo systemctl stop hymgr")
    try:
        facts = dcu_module(host, "dcu.serving.dcu_facts", sysfs_root=SYSFS)["ansible_facts"]["dcu"]
        assert facts["source"] == "sysfs" and facts["card_count"] == 8
        assert any("Connect server failed" in e and "start it (systemctl start hymgr)" in e for e in facts["errors"])
    finally:
        host.run("sudo systemctl start hymgr")
