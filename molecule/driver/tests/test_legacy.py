"""The legacy node: an older hycu module was loaded when the new driver was installed.

Converge ran with dcu_driver_reboot: false (the reboot is reported as pending). These tests run in
order: unset must fail with the reason, then true must reboot and verify. (That unset does not fail
when no reboot is needed is what the node's converge and idempotence already prove.)
"""

from __future__ import annotations

testinfra_hosts = ["legacy"]
OLD, NEW = "6.3.27-V1.2.5", "6.3.30-V1.4.1a"
SYSFS = "/run/dcu-emu/sys"


def _loaded(host):
    return host.file(f"{SYSFS}/module/hycu/version").content_string.strip()


def test_installed_but_old_module_still_loaded(host):
    assert host.package("rock").version == NEW
    assert _loaded(host) == OLD


def test_both_prompts_answered_from_the_role_variables(host):
    log = host.file(f"/var/log/dcu-serving/rock-install-{NEW}.log").content_string
    assert "Do you want to remove legacy hymgr config file? [Y/n]: y" in log
    assert "Update vbios? [y/N]: n" in log
    assert not host.file("/etc/hymgr/hymgr.conf").exists


def test_reboot_needed_but_not_allowed_fails_naming_the_reason(host, run_drivers, recap):
    rc, out = run_drivers("legacy", extra_vars={"dcu_driver_reboot": None})
    assert rc != 0, out[-3000:]
    assert "Reboot required but not allowed" in out
    assert f"the loaded hycu module is version {OLD} but rock {NEW} is installed" in out
    assert "Set dcu_driver_reboot: true" in out
    assert recap(out, "legacy")["failed"] == 1
    assert _loaded(host) == OLD, "a refused reboot must not happen"


def test_reboot_allowed_reboots_and_verifies(host, run_drivers, recap):
    rc, out = run_drivers("legacy", extra_vars={"dcu_driver_reboot": True})
    assert rc == 0, out[-3000:]
    assert "Reboot to load the new driver" in out
    assert recap(out, "legacy")["changed"] == 1, "only the reboot changes anything"
    assert _loaded(host) == NEW
    assert host.service("hymgr").is_running
