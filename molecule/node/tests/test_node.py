"""testinfra checks of the emulated DCU node (molecule/node): what every other scenario relies on."""

import json

SYSFS = "/run/dcu-emu/sys"
CARDS = 2  # molecule.yml: cards: 2


def test_systemd_is_pid1_and_running(host):
    assert host.run("cat /proc/1/comm").stdout.strip() == "systemd"
    state = host.run("systemctl is-system-running").stdout.strip()
    assert state in ("running", "degraded"), host.run("systemctl --failed --no-pager").stdout
    assert host.run("systemctl is-active dcu-emu").stdout.strip() == "active"


def test_no_dcu_device_nodes_before_a_driver_loads(host):
    for path in ("/dev/kfd", "/dev/mkfd", "/dev/dri"):
        assert not host.file(path).exists, path


def test_sysfs_shows_the_profiles_cards_unbound_among_the_cpus_functions(host):
    """k100ai-2s: two Hygon sockets' own 0x1d94 functions (bridges, IOMMU, PSP, data fabric) beside the cards."""
    devices = f"{SYSFS}/bus/pci/devices"
    listing = host.check_output(f"grep -l 0x1d94 {devices}/*/vendor | wc -l")
    assert int(listing) > 100
    classes = host.check_output(f"cat {devices}/0000:07:00.0/class {devices}/0000:0a:00.0/device")
    assert classes.split() == ["0x0b4000", "0x6210"]
    assert host.file(f"{devices}/0000:00:00.2/class").content_string.strip() == "0x080600"  # the IOMMU
    assert not host.file(f"{devices}/0000:07:00.0/driver").exists, "no driver has bound the cards yet"
    assert host.file(f"{SYSFS}/class/drm/card0/device/vendor").content_string.strip() == "0x1a03"  # the VGA
    assert not host.file(f"{SYSFS}/module/hycu").exists


def test_the_emulated_kernel_binds_the_cards_and_creates_their_nodes_on_modprobe(host):
    kernel = host.check_output("uname -r")
    host.run_expect([0], f"mkdir -p /lib/modules/{kernel}/extra && "
                         f"printf 'version=6.3.30-V1.4.1a\\n' > /lib/modules/{kernel}/extra/hycu.ko")
    host.run_expect([0], "modprobe hycu")
    bdfs = [host.check_output(f"basename $(readlink -f {SYSFS}/class/drm/renderD{128 + i}/device)")
            for i in range(CARDS)]
    assert bdfs == ["0000:07:00.0", "0000:0a:00.0"]
    assert host.check_output(f"basename $(readlink -f {SYSFS}/bus/pci/devices/0000:07:00.0/driver)") == "hycu"
    assert host.file(f"{SYSFS}/module/hycu/version").content_string.strip() == "6.3.30-V1.4.1a"
    for path in ["/dev/kfd", "/dev/mkfd"] + [f"/dev/dri/renderD{128 + i}" for i in range(CARDS)]:
        assert host.run(f"stat -c %F {path}").stdout.strip() == "character special file"
    # systemd's own rules (the driver's are not installed here): kfd and render nodes to render, cards to video.
    assert (host.file("/dev/kfd").group, host.file("/dev/kfd").mode) == ("render", 0o660)
    assert host.file("/dev/dri/renderD128").group == "render"
    assert host.file("/dev/dri/card1").group == "video"
    assert not host.file(f"/dev/dri/card{CARDS + 1}").exists


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
    """After the module loaded (the test above): a container gets /dev/kfd as the units give it."""
    assert host.service("docker").is_running
    assert host.run("docker info --format '{{.Driver}}'").stdout.strip() == "vfs"
    loaded = host.run("docker load -i /var/lib/dcu-serving/images/tiny.tar")
    assert loaded.rc == 0, loaded.stderr
    assert "dcu-mol-node/tiny:1" in loaded.stdout
    run = host.run("docker run --rm --network none --device /dev/kfd dcu-mol-node/tiny:1 "
                   "/bin/sh -c 'test -c /dev/kfd && echo kfd-is-a-char-device'")
    assert run.rc == 0, run.stderr
    assert run.stdout.strip() == "kfd-is-a-char-device"
