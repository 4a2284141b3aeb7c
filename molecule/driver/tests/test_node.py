"""The 8-card node after converge + idempotence: the whole host layer, from an offline bundle."""

from __future__ import annotations

import json

import pytest

testinfra_hosts = ["node"]
CARDS = 8
DRIVER_VERSION = "6.3.30-V1.4.1a"
SYSFS = "/run/dcu-emu/sys"


def test_driver_package_and_module(host):
    assert host.package("rock").is_installed
    assert host.package("rock").version == DRIVER_VERSION
    assert host.file(f"{SYSFS}/module/hycu/version").content_string.strip() == DRIVER_VERSION


def test_the_driver_came_back_after_the_first_install_s_reboot_past_the_vendor_s_blacklist(host):
    # The vbios update of the first install made the role reboot the node. At that boot Hygon's blacklist was in
    # force (a modules-load.d entry would have been skipped) and nothing else loaded the module: the unit's condition
    # (no module yet) held, and dcu-driver.service loaded it (field evidence N6, N7).
    assert host.file("/etc/modprobe.d/blacklist-hycu.conf").content_string.split() == ["blacklist", "hycu"]
    assert not host.file("/etc/modules-load.d/dcu.conf").exists
    unit = host.file("/etc/systemd/system/dcu-driver.service").content_string
    assert "ExecStart=/opt/hyhal/bin/hy-smi --loaddriver" in unit and "Before=hymgr.service" in unit
    assert f"ConditionPathExists=!{SYSFS}/module/hycu" in unit
    service = host.service("dcu-driver")
    assert service.is_enabled
    shown = dict(line.split("=", 1) for line in host.check_output(
        "systemctl show dcu-driver -p ActiveState -p ExecMainStatus -p ConditionResult").splitlines())
    assert shown == {"ActiveState": "active", "ExecMainStatus": "0", "ConditionResult": "yes"}, \
        "at this boot the driver was not loaded until dcu-driver.service loaded it"
    boots = host.check_output("journalctl --list-boots --no-pager | wc -l")
    assert int(boots) >= 2, "the first install's vbios update rebooted the node"
    assert host.file("/run/dcu-driver.reboot-required").exists is False


def test_installer_prompts_answered_and_success_logged(host):
    log = host.file(f"/var/log/dcu-serving/rock-install-{DRIVER_VERSION}.log")
    assert (log.user, log.mode) == ("root", 0o600)
    text = log.content_string
    # A first install on a physical server (the node says bare metal): -A, and the vbios updated (Hygon's guide).
    assert text.splitlines()[0] == (
        f"[answer_prompts] ran: /bin/bash /var/lib/dcu-serving/bundle/driver/rock-{DRIVER_VERSION}.run -A")
    assert "Update vbios? [y/N]: y" in text  # K100_AI cards: asked, a first install says yes (first-install)
    assert "legacy hymgr config" not in text  # no legacy config on this node: not asked
    assert "HCU online 8, total num 8" in text and "Install successful. Enjoy now!" in text


def test_hymgr_running_and_hy_smi_answers(host):
    hymgr = host.service("hymgr")
    assert hymgr.is_running and hymgr.is_enabled
    table = host.check_output("/opt/hyhal/bin/hy-smi")
    rows = [line.split()[0] for line in table.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert rows == [str(i) for i in range(CARDS)]
    assert f"Driver Version: {DRIVER_VERSION}" in host.check_output("/opt/hyhal/bin/hy-smi --showdriverversion")


def test_dtk_link_environment_and_linker_path(host):
    assert host.file("/opt/dtk").is_symlink
    assert host.file("/opt/dtk").linked_to == "/opt/dtk-26.04-DCC2602-0317"  # real 26.04 tarballs name it so
    assert host.file("/opt/dtk/.info/rocm_version").content_string.strip() == "26.04"
    # The tarball's files are its build user's (uid 1000), one of them group-writable: root sources env.sh, so
    # every file is root's and writable by root alone.
    assert host.check_output("find /opt/dtk/ ! -type l \\( ! -user root -o ! -group root -o -perm /022 \\)") == ""
    assert host.file("/opt/dtk/share/dtk-build.log").mode == 0o644
    env = host.check_output("bash -lc 'echo $ROCM_PATH $HIP_PATH; command -v hipcc'").split()
    assert env == ["/opt/dtk", "/opt/dtk/hip", "/opt/dtk/bin/hipcc"]
    assert "/opt/dtk/lib" in host.file("/etc/ld.so.conf.d/dtk.conf").content_string.splitlines()
    assert "/opt/dtk/lib:" in host.check_output("ldconfig -vN 2>/dev/null")
    # The ldconfig handler ran after the entry was written.
    assert host.file("/etc/ld.so.cache").mtime >= host.file("/etc/ld.so.conf.d/dtk.conf").mtime


@pytest.mark.parametrize("user", ["dcu-serving", "dcu-batch"])
def test_service_users_in_the_device_groups(host, user):
    account = host.user(user)
    assert account.exists and {"render", "video"} <= set(account.groups)
    assert account.shell == "/usr/sbin/nologin"
    # The udev rules the host had when the driver loaded (Hygon's, systemd's): render for compute, video
    # for display nodes.
    assert host.file("/dev/kfd").group == "render"
    assert host.file("/dev/dri/card1").group == "video"


def test_udev_rules_tighten_the_vendors_world_writable_nodes(host):
    assert host.file("/etc/udev/rules.d/16-dcu.rules").exists, "the driver package's own rules"
    rules = host.file("/etc/udev/rules.d/70-dcu.rules").content_string
    assert 'KERNEL=="kfd", GROUP="render", MODE="0660"' in rules
    assert 'KERNEL=="mkfd", GROUP="render", MODE="0660"' in rules
    assert 'KERNEL=="renderD*", ATTRS{vendor}=="0x1d94", GROUP="render", MODE="0660"' in rules
    assert 'KERNEL=="card*", ATTRS{vendor}=="0x1d94", GROUP="video", MODE="0660"' in rules


def test_dcu_facts_reports_the_cards_with_numa_nodes(host, dcu_module):
    result = dcu_module(host, "dcu.serving.dcu_facts", sysfs_root=SYSFS)
    facts = result["ansible_facts"]["dcu"]
    assert facts["source"] == "hy-smi-json"
    assert facts["card_count"] == CARDS
    # Two sockets of four dies: the cards sit on NUMA nodes 0 and 4 (the CPUs' 0x1d94 functions are no cards).
    assert [c["numa_node"] for c in facts["cards"]] == [0, 0, 0, 0, 4, 4, 4, 4]
    assert facts["platform_functions"] > 100
    assert [c["render_node"] for c in facts["cards"]] == [f"/dev/dri/renderD{128 + i}" for i in range(CARDS)]
    assert [c["card_node"] for c in facts["cards"]] == [f"/dev/dri/card{1 + i}" for i in range(CARDS)]
    assert facts["cards"][4]["pci_bus"] == "0000:87:00.0"
    assert {c["series"] for c in facts["cards"]} == {"K100_AI"}
    assert facts["driver"] == {"loaded": True, "module": "hycu", "version": DRIVER_VERSION}
    assert facts["dtk"]["version"] == "26.04"
    assert facts["hyhal"]["path"] == "/opt/hyhal"


def test_device_access_passes_for_the_service_user(host, dcu_module):
    result = dcu_module(host, "dcu.serving.dcu_device_access", user="dcu-serving", sysfs_root=SYSFS,
                    expected_cards=CARDS)
    assert result["problems"] == [], result.get("msg")
    assert len(result["nodes"]) == 2 + CARDS
    assert {n["result"] for n in result["nodes"]} == {"ok"}
    assert {n["group"] for n in result["nodes"]} == {"render"}


def test_device_access_fails_for_an_outsider_with_the_fix(host, dcu_module):
    result = dcu_module(host, "dcu.serving.dcu_device_access", user="nobody", sysfs_root=SYSFS)
    assert result["problems"], "an outsider must not pass"
    assert "user nobody cannot use the DCUs" in result["msg"]
    assert "user nobody is not in group render" in result["msg"]
    assert "usermod -aG render nobody" in result["msg"]
    denied = {n["path"] for n in result["nodes"] if n["result"] == "permission denied"}
    # The node rebooted after the install: the role's rules (0660) applied to every node, mkfd included.
    assert denied == {"/dev/kfd", "/dev/mkfd"} | {f"/dev/dri/renderD{128 + i}" for i in range(CARDS)}


def test_staged_artifacts_are_cached_by_path_size_mtime(host, bundle_index):
    cache = json.loads(host.file("/var/cache/dcu-serving/sha256-cache.json").content_string)
    for artifact in bundle_index["artifacts"]:
        if artifact["kind"] in ("driver", "dtk"):
            entry = cache[f"/var/lib/dcu-serving/bundle/{artifact['file']}"]
            assert entry["sha256"] == artifact["sha256"] and entry["size"] == artifact["size"]


def test_check_mode_on_the_converged_node_reports_no_change(run_drivers, recap):
    rc, out = run_drivers("node", "--check", "--diff")
    assert rc == 0, out[-3000:]
    assert recap(out, "node")["changed"] == 0
