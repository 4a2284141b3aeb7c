"""testinfra checks of the emulated DCU node (molecule/node): what every other scenario relies on."""

import json

import pytest

SYSFS = "/run/dcu-emu/sys"
CARDS = 2  # molecule.yml: cards: 2


def test_systemd_is_pid1_and_running(host):
    assert host.run("cat /proc/1/comm").stdout.strip() == "systemd"
    state = host.run("systemctl is-system-running").stdout.strip()
    assert state in ("running", "degraded"), host.run("systemctl --failed --no-pager").stdout
    assert host.run("systemctl is-active dcu-emu").stdout.strip() == "active"


@pytest.mark.parametrize(
    "path",
    ["/dev/kfd", "/dev/mkfd"]
    + [f"/dev/dri/card{i + 1}" for i in range(CARDS)]
    + [f"/dev/dri/renderD{128 + i}" for i in range(CARDS)],
)
def test_device_nodes_are_video_group_0660_char_devices(host, path):
    dev = host.file(path)
    assert host.run(f"stat -c %F {path}").stdout.strip() == "character special file"
    assert (dev.user, dev.group, dev.mode) == ("root", "video", 0o660)


def test_no_extra_cards(host):
    assert not host.file(f"/dev/dri/card{CARDS + 1}").exists
    assert not host.file(f"/dev/dri/renderD{128 + CARDS}").exists


def test_sysfs_has_the_dcu_cards_and_the_vga_card0(host):
    vendors = host.run(f"cat {SYSFS}/class/drm/card*/device/vendor").stdout.split()
    assert vendors.count("0x1d94") == CARDS
    assert host.file(f"{SYSFS}/class/drm/card0/device/vendor").content_string.strip() == "0x1a03"
    bdfs = [host.run(f"basename $(readlink -f {SYSFS}/class/drm/renderD{128 + i}/device)").stdout.strip()
            for i in range(CARDS)]
    assert bdfs == ["0000:04:00.0", "0000:05:00.0"]
    assert host.file(f"{SYSFS}/bus/pci/devices/0000:04:00.0/device").content_string.strip() == "0x6210"
    assert host.file(f"{SYSFS}/bus/pci/devices/0000:05:00.0/numa_node").content_string.strip() == "1"
    # no driver installed yet: no module loaded
    assert not host.file(f"{SYSFS}/module/hycu").exists


def test_driver_build_prerequisites(host):
    for tool in ("gcc", "g++", "make", "cmake", "automake", "lspci"):
        assert host.exists(tool), tool
    kernel = host.run("uname -r").stdout.strip()
    assert host.file(f"/lib/modules/{kernel}/build/Makefile").is_file


def test_node_has_no_network(host):
    # network_mode: none — only loopback and the node's own Docker bridge, no uplink.
    links = json.loads(host.run("ip -j link show").stdout)
    assert {link["ifname"] for link in links} <= {"lo", "docker0"}
    assert host.run("ip -j route show default").stdout.strip() in ("", "[]")


def test_docker_inside_loads_a_tarball_and_runs_with_kfd(host):
    assert host.service("docker").is_running
    assert host.run("docker info --format '{{.Driver}}'").stdout.strip() == "vfs"
    loaded = host.run("docker load -i /var/lib/dcu-serving/images/tiny.tar")
    assert loaded.rc == 0, loaded.stderr
    assert "dcu-mol-node/tiny:1" in loaded.stdout
    run = host.run("docker run --rm --network none --device /dev/kfd dcu-mol-node/tiny:1 "
                   "/bin/sh -c 'test -c /dev/kfd && echo kfd-is-a-char-device'")
    assert run.rc == 0, run.stderr
    assert run.stdout.strip() == "kfd-is-a-char-device"
