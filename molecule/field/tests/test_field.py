"""The BW OAM box on a Kylin V10-like OS after site.yml over SSH (converged twice): what an operator trying us on a
real host would check first. Tests run in file order; the reboot, and the ones that stop hymgr or break the
inventory, come last."""

from __future__ import annotations

import json
import time

import testkit
from testkit import PROJECT

from support import wait_until  # tests/support.py, on pytest's pythonpath

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
    status = lb_status(host)
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


# --- The host around the cards: Kylin V10's docker 18.09, SELinux enforcing, the vendor's blacklist ------------------

def lb_status(host) -> dict:
    return json.loads(host.check_output(
        "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://127.0.0.1:8000/__lb_status\", "
        "timeout=5).read().decode())'"))


def test_every_container_runs_on_docker_18_09_with_only_the_flags_it_knows(host):
    assert host.check_output("sudo docker version --format '{{.Server.Version}}'") == "18.09.0"
    unit = host.check_output("systemctl cat vllm@.service")
    assert "--pull" not in "".join(line for line in unit.splitlines() if not line.startswith("#")), \
        "docker 18.09 answers 'unknown flag: --pull'"
    inspect = json.loads(host.check_output("sudo docker inspect vllm-0"))[0]
    assert inspect["State"]["Running"]


def test_selinux_is_enforcing_and_the_containers_read_the_host_paths_they_mount(host):
    assert host.check_output("sudo getenforce") == "Enforcing"
    for index in range(8):
        inspect = json.loads(host.check_output(f"sudo docker inspect vllm-{index}"))[0]
        assert "label=disable" in inspect["HostConfig"]["SecurityOpt"], "as Hygon's recipes run DCU containers"
        assert "/opt/hyhal:/opt/hyhal:ro" in inspect["HostConfig"]["Binds"]
    denials = host.run("sudo grep -c 'scontext=system_u:system_r:container_t' /var/log/audit/audit.log").stdout
    assert denials.strip() in ("", "0"), "a container was denied a host path"


def test_vllm_runs_in_the_image_s_own_dtk_with_the_host_s_hyhal(host):
    # Hygon's recipe (runtime image): the image's /opt/dtk, its env.sh sourced because its ENV lacks ROCM_PATH.
    inspect = json.loads(host.check_output("sudo docker inspect vllm-0"))[0]
    assert not any(bind.split(":")[1] == "/opt/dtk" for bind in inspect["HostConfig"]["Binds"])
    pid = host.check_output("sudo docker inspect --format '{{.State.Pid}}' vllm-0")
    environ = host.check_output(f"sudo cat /proc/{pid}/environ").split("\x00")
    assert "ROCM_PATH=/opt/dtk" in environ, "the unit sourced the image's /opt/dtk/env.sh before vllm serve"


def test_the_switch_endpoints_the_driver_binds_are_counted_apart_not_as_cards(host, dcu_module):
    facts = dcu_module(host, "dcu.serving.dcu_facts", sysfs_root=SYSFS)["ansible_facts"]["dcu"]
    assert facts["card_count"] == 8 and facts["unbound"] == []
    assert facts["driver_functions"] == 14, "two switch trees of seven a110 endpoints, bound to hycu"


def test_the_bw_host_got_its_map_count(host):
    assert host.file("/etc/sysctl.d/90-dcu-serving.conf").content_string.splitlines()[-1].startswith(
        "vm.max_map_count = ")
    assert int(host.file("/proc/sys/vm/max_map_count").content_string) >= 262144


def test_the_doctor_finds_the_host_around_the_cards_in_order(host):
    rc, output = testkit.run_playbook("doctor.yml", env={"ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"},
                                      timeout=300)
    assert rc == 0, output[-3000:]
    document, _end = json.JSONDecoder().raw_decode(output[output.find("{"):])
    tasks = [task for play in document["plays"] for task in play["tasks"]]
    [read] = [task["hosts"]["node"] for task in tasks if task["task"]["name"] == "Read the findings"]
    statuses = {f["check"]: (f["status"], f["message"]) for f in read["ansible_facts"]["__doctor"]["checks"]}
    assert statuses["boot"][0] == "ok" and "dcu-driver.service loads it" in statuses["boot"][1]
    assert statuses["engine"] == ("ok", "docker 18.09.0 runs vllm@.service")
    assert statuses["selinux"] == ("ok", "SELinux is enforcing; the containers run with label=disable")
    assert statuses["kernel"][0] == "ok"


def test_an_engine_older_than_supported_is_refused_in_seconds_before_anything_changes(host, run_playbook):
    os_file = "/run/dcu-emu/os.json"
    original = json.loads(host.file(os_file).content_string)
    older = json.dumps(dict(original, docker_version="1.13.1", docker_api_version="1.26"))
    host.run_expect([0], f"echo '{older}' | sudo tee {os_file} >/dev/null")
    try:
        assert host.check_output("sudo docker version --format '{{.Server.Version}}'") == "1.13.1"
        start = time.monotonic()
        rc, output = run_playbook("site.yml")
        took = time.monotonic() - start
    finally:
        host.run_expect([0], f"echo '{json.dumps(original)}' | sudo tee {os_file} >/dev/null")
    assert rc != 0
    assert "docker 1.13.1 is older than the oldest engine supported (18.09): install docker-ce" in output
    assert "dcu_driver" not in output, "refused in the preflight play, before the driver's"
    assert took < 30, f"refused after {took:.0f} s"


def test_after_a_reboot_the_driver_hymgr_and_8_of_8_come_back_with_nothing_done_by_hand(host):
    rc, output = testkit.reboot("node")
    assert rc == 0, output[-3000:]
    # The vendor's blacklist was in force at this boot (a modules-load.d entry would have been skipped) and nothing
    # else loaded the driver: dcu-driver.service's condition (no module yet) held, and it loaded it.
    assert host.file("/etc/modprobe.d/blacklist-hycu.conf").content_string.split() == ["blacklist", "hycu"]
    assert host.file(f"{SYSFS}/module/hycu").is_directory
    shown = host.check_output("systemctl show dcu-driver -p ActiveState -p ExecMainStatus -p ConditionResult")
    assert sorted(shown.splitlines()) == ["ActiveState=active", "ConditionResult=yes", "ExecMainStatus=0"]
    assert host.service("hymgr").is_running
    wait_until(lambda: (lb_status(host)["healthy"], lb_status(host)["total"]) == (8, 8), 120,
               what="8/8 healthy behind the proxy after the reboot")
    for card in range(8):
        assert host.service(f"vllm@{card}").is_running
    assert host.check_output("sudo getenforce") == "Enforcing"


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
