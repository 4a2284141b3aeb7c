"""dcu_facts run as Ansible runs it: against hy-smi printing real-format samples, and against the emulated
hy-smi of each node profile over a fake sysfs, where every source mode must give the same cards."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from modules.sysfs import BW_BDFS

from support import REPO

HY_SMI = REPO / "tools" / "vendor" / "rock" / "hy-smi"
PROFILES = json.loads((REPO / "tools" / "images" / "node" / "files" / "profiles.json").read_text())
MAPPING = ("index", "pci_bus", "card_node", "render_node", "numa_node")


def _facts(module_runner, **args):
    result = module_runner("dcu_facts", args)
    assert not result.get("failed"), result
    assert result["changed"] is False
    return result["ansible_facts"]["dcu"]


@pytest.fixture
def hymgr(tmp_path):
    """A listening Unix socket where the emulated hy-smi looks for hymgr; close() stops it."""
    path = tmp_path / "hymgr.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)

    def serve():
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    yield server
    server.close()


@pytest.fixture
def emulated_host(tmp_path, fake_sysfs, monkeypatch, hymgr):
    """emulated_host("bw-oam", ...) -> a fake sysfs of that profile's cards, seen by the emulated hy-smi."""
    def build(name, **sysfs):
        profile = dict(PROFILES[name], name=name)
        sysfs.setdefault("switches_bound", profile["driver_binds_switches"] and sysfs.get("module") is not None)
        root = fake_sysfs(bdfs=[bdf for bdf, _ in profile["cards"]], numa=[n for _, n in profile["cards"]],
                          device=profile["device_id"], klass=profile["class"], drm_base=profile["drm_card_base"],
                          platform=True, **sysfs)
        (tmp_path / "dcu-emu.env").write_text(f"DCU_EMU_SYSFS={root}\n")
        (tmp_path / "profile.json").write_text(json.dumps(profile))
        monkeypatch.setenv("DCU_EMU_ENV_FILE", str(tmp_path / "dcu-emu.env"))
        monkeypatch.setenv("DCU_EMU_PROFILE_FILE", str(tmp_path / "profile.json"))
        monkeypatch.setenv("DCU_EMU_HYMGR_SOCKET", hymgr.getsockname())
        return root
    return build


@pytest.mark.parametrize("profile, module", [("bw-oam", ("hycu", "")), ("k100ai-2s", ("hycu", "6.3.30-V1.4.1a")),
                                             ("z100l-legacy", ("hydcu", "6.2.35"))])
def test_every_source_gives_the_same_cards(emulated_host, module_runner, profile, module):
    root = emulated_host(profile, module=module)
    (root / "module" / module[0] / "loaded-version").write_text("6.3.30-V1.4.1a\n")
    views = {}
    for source in ("auto", "hy-smi-json", "hy-smi-text", "sysfs"):
        facts = _facts(module_runner, sysfs_root=str(root), hy_smi_path=str(HY_SMI), source=source)
        views[source] = [tuple(card[key] for key in MAPPING) for card in facts["cards"]]
        assert facts["card_count"] == 8, (source, facts["errors"])
        assert facts["unbound"] == []
        assert facts["platform_functions"] > 10, "the CPU's (and switch's) own 0x1d94 functions are counted apart"
        # bw-oam's driver binds its a110 switch endpoints too: counted, not cards, not a fault.
        assert facts["driver_functions"] == (7 if PROFILES[profile]["driver_binds_switches"] else 0)
    assert views["auto"] == views["hy-smi-json"] == views["hy-smi-text"] == views["sysfs"]
    expected_bdfs = [bdf for bdf, _ in PROFILES[profile]["cards"]]
    assert [card[1] for card in views["auto"]] == expected_bdfs


def test_bw_box_index_follows_hy_smi_not_pci_order(emulated_host, module_runner):
    root = emulated_host("bw-oam", module=("hycu", ""))
    (root / "module" / "hycu" / "loaded-version").write_text("6.3.30-V1.4.1a\n")
    facts = _facts(module_runner, sysfs_root=str(root), hy_smi_path=str(HY_SMI))
    assert facts["source"] == "hy-smi-json", facts["errors"]
    by_index = {c["index"]: c for c in facts["cards"]}
    assert by_index[1]["pci_bus"] == "0000:2b:00.0" and by_index[2]["pci_bus"] == "0000:14:00.0"
    assert by_index[1]["render_node"] == "/dev/dri/renderD129"
    assert by_index[0]["card_node"] == "/dev/dri/card0", "no VGA on this box: DRM cards start at card0"
    assert [c["numa_node"] for c in facts["cards"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {c["series"] for c in facts["cards"]} == {"BW"}
    # No version file in sysfs on this driver: the version comes from hy-smi, as it prints it (6.3.30).
    assert facts["driver"] == {"loaded": True, "module": "hycu", "version": "6.3.30"}


def test_without_hymgr_the_cards_come_from_sysfs_and_the_error_names_hymgr(emulated_host, module_runner,
                                                                           monkeypatch, tmp_path):
    root = emulated_host("bw-oam", module=("hycu", ""))
    monkeypatch.setenv("DCU_EMU_HYMGR_SOCKET", str(tmp_path / "nothing-listens-here.sock"))
    facts = _facts(module_runner, sysfs_root=str(root), hy_smi_path=str(HY_SMI))
    assert facts["source"] == "sysfs"
    assert facts["card_count"] == 8
    assert any("Connect server failed" in e and "systemctl start hymgr" in e for e in facts["errors"]), facts["errors"]
    forced = module_runner("dcu_facts", {"sysfs_root": str(root), "hy_smi_path": str(HY_SMI), "source": "hy-smi-json"})
    assert forced["failed"] and "hymgr" in forced["msg"]


def test_a_driver_that_is_not_loaded_leaves_cards_unbound(emulated_host, module_runner):
    root = emulated_host("k100ai-2s", drm=False)
    facts = _facts(module_runner, sysfs_root=str(root), hy_smi_path=str(HY_SMI))
    assert facts["card_count"] == 0
    assert [d["pci_bus"] for d in facts["unbound"]] == sorted(bdf for bdf, _ in PROFILES["k100ai-2s"]["cards"])
    assert facts["unbound"][0]["summary"] == "0000:07:00.0 (0x6210 K100_AI): driver none, no DRM nodes"
    assert facts["driver"] == {"loaded": False, "module": None, "version": None}


def test_real_format_samples_with_dtk_and_hyhal(fake_sysfs, fake_hy_smi, module_runner, tmp_path, sample):
    root = fake_sysfs(module=("hycu", ""), bdfs=sorted(BW_BDFS), drm_base=0, numa=[0] * 8)
    flags = "--showbus --showproductname --showmeminfo vram --showtoponuma"
    hy_smi = fake_hy_smi({flags: "showbus_bw1100.txt", "--showdriverversion": "driverversion_6331.txt"})
    dtk = tmp_path / "dtk-26.04"
    (dtk / ".info").mkdir(parents=True)
    (dtk / ".info" / "rocm_version").write_text("26.04\n")
    facts = _facts(module_runner, sysfs_root=str(root), hy_smi_path=str(hy_smi), dtk_path=str(dtk))
    assert facts["source"] == "hy-smi-text"
    assert any("--json exited 1" in e for e in facts["errors"])
    assert [c["pci_bus"] for c in facts["cards"]] == BW_BDFS
    assert facts["driver"]["version"] == "6.3.31-V1.5.0a"
    assert facts["dtk"] == {"path": str(dtk), "version": "26.04"}
    assert facts["hyhal"]["hy_smi"] == str(hy_smi)


def test_missing_hy_smi_and_bad_arguments(fake_sysfs, module_runner, tmp_path):
    facts = _facts(module_runner, sysfs_root=str(fake_sysfs(cards=2)), hy_smi_path=str(tmp_path / "none"),
                   dtk_path=str(tmp_path / "no-dtk"))
    assert facts["source"] == "sysfs"
    assert [c["render_node"] for c in facts["cards"]] == ["/dev/dri/renderD128", "/dev/dri/renderD129"]
    assert facts["hyhal"] == {"path": None, "hy_smi": None}
    bad = module_runner("dcu_facts", {"source": "nvidia-smi"})
    assert bad["failed"] and "source" in bad["msg"] and "hy-smi-json" in bad["msg"]


def test_the_probe_reads_in_the_same_call_what_a_role_decides_by(fake_sysfs, module_runner, tmp_path):
    root = fake_sysfs(cards=2, numa=[0, 1])
    for node, cpus in ((0, "0-3"), (1, "4-7")):
        (root / "devices" / "system" / "node" / f"node{node}").mkdir(parents=True)
        (root / "devices" / "system" / "node" / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "dtk-26.04").mkdir()
    (tmp_path / "dtk").symlink_to(tmp_path / "dtk-26.04")
    (tmp_path / "record.json").write_text('{"dir": "x"}\n')
    result = module_runner("dcu_facts", {
        "sysfs_root": str(root), "hy_smi_path": str(tmp_path / "none"),
        "stat": [str(tmp_path / "dtk"), str(tmp_path / "dtk-26.04"), str(tmp_path / "absent")],
        "read": [str(tmp_path / "record.json"), str(tmp_path / "absent")],
        "commands": {"echo": ["sh", "-c", "echo out; echo err >&2; exit 3"], "missing": ["no-such-command-x"]},
        "getent": ["group"]})
    assert not result.get("failed"), result
    assert result["changed"] is False
    assert result["ansible_facts"]["dcu"]["numa_cpus"] == {"0": "0-3", "1": "4-7"}
    stat = result["probe"]["stat"]
    link = stat[str(tmp_path / "dtk")]
    assert link["islnk"] and link["lnk_target"] == str(tmp_path / "dtk-26.04")
    assert stat[str(tmp_path / "dtk-26.04")]["isdir"] and not stat[str(tmp_path / "dtk-26.04")]["islnk"]
    assert stat[str(tmp_path / "dtk-26.04")]["gr_name"], "the owning group is named"
    assert stat[str(tmp_path / "absent")] == {"exists": False, "isdir": False, "islnk": False, "lnk_target": None,
                                              "gr_name": None}
    assert result["probe"]["read"] == {str(tmp_path / "record.json"): '{"dir": "x"}\n', str(tmp_path / "absent"): None}
    commands = result["probe"]["commands"]
    assert (commands["echo"]["rc"], commands["echo"]["stdout"], commands["echo"]["stderr"]) == (3, "out\n", "err\n")
    assert commands["missing"]["rc"] == 127 and "no-such-command-x" in commands["missing"]["stderr"]
    assert "root" in result["ansible_facts"]["getent_group"]
    assert result["ansible_facts"]["getent_group"]["root"][1] == "0", "name -> [password, gid, members]"


def test_a_command_that_is_not_an_argument_list_is_refused(fake_sysfs, module_runner, tmp_path):
    result = module_runner("dcu_facts", {"sysfs_root": str(fake_sysfs(cards=1)), "hy_smi_path": str(tmp_path / "none"),
                                         "commands": {"rock": "dpkg-query -W rock*"}})
    assert result["failed"] and "rock" in result["msg"] and "argv" in result["msg"]


def test_device_nodes_name_the_group_of_each_node_that_exists(fake_sysfs, module_runner, tmp_path):
    """The nodes of a fake sysfs do not exist in this /dev: none is listed, unless the host has a /dev/kfd."""
    import grp
    import os
    facts = _facts(module_runner, sysfs_root=str(fake_sysfs(cards=2)), hy_smi_path=str(tmp_path / "none"))
    expected = {}
    for path in ["/dev/kfd", "/dev/mkfd", "/dev/dri/card1", "/dev/dri/renderD128", "/dev/dri/card2",
                 "/dev/dri/renderD129"]:
        if os.path.exists(path):
            gid = os.stat(path).st_gid
            expected[path] = {"gid": gid, "group": grp.getgrgid(gid).gr_name}
    assert facts["device_nodes"] == expected


def test_host_probe_looks_without_the_cards(module_runner, tmp_path):
    (tmp_path / "venv-abc").mkdir()
    (tmp_path / "venv").symlink_to("venv-abc")
    result = module_runner("host_probe", {"stat": [str(tmp_path / "venv")], "read": [str(tmp_path / "none")],
                                          "commands": {"systemd": ["sh", "-c", "echo systemd 252"]},
                                          "getent": ["passwd"], "_ansible_check_mode": True})
    assert not result.get("failed"), result
    assert result["changed"] is False and "dcu" not in result["ansible_facts"]
    assert result["probe"]["stat"][str(tmp_path / "venv")]["lnk_target"] == "venv-abc"
    assert result["probe"]["read"] == {str(tmp_path / "none"): None}
    assert result["probe"]["commands"]["systemd"]["stdout"] == "systemd 252\n", "commands run in check mode too"
    assert result["ansible_facts"]["getent_passwd"]["root"][1] == "0"
