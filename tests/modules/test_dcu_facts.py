"""dcu_facts run as Ansible runs it, against a fake sysfs and an hy-smi printing real-format samples."""

from __future__ import annotations


def _facts(module_runner, **args):
    result = module_runner("dcu_facts", args)
    assert not result.get("failed"), result
    assert result["changed"] is False
    return result["ansible_facts"]["dcu"]


def test_json_source_with_nodes_from_sysfs(fake_sysfs, fake_hy_smi, module_runner, tmp_path):
    root = fake_sysfs(module=("hycu", "6.3.30-V1.4.1a"))
    hy_smi = fake_hy_smi({"--json": "json_hcu_card0_mib.txt", "": "table_hcu.txt"})
    dtk = tmp_path / "dtk-26.04"
    (dtk / ".info").mkdir(parents=True)
    (dtk / ".info" / "rocm_version").write_text("26.04\n")
    facts = _facts(module_runner, sysfs_root=str(root), hy_smi_path=str(hy_smi), dtk_path=str(dtk))
    assert facts["source"] == "hy-smi --json"
    assert facts["card_count"] == 3
    assert facts["cards"][2] == {
        "index": 2, "pci_bus": "0000:83:00.0", "series": "K100_AI", "numa_node": 1, "vram_total_mib": 65520,
        "card_node": "/dev/dri/card5", "render_node": "/dev/dri/renderD132"}
    assert facts["driver"] == {"loaded": True, "module": "hycu", "version": "6.3.30-V1.4.1a"}
    assert facts["dtk"] == {"path": str(dtk), "version": "26.04"}
    assert facts["hyhal"]["hy_smi"] == str(hy_smi)


def test_table_when_json_fails(fake_sysfs, fake_hy_smi, module_runner):
    root = fake_sysfs()
    hy_smi = fake_hy_smi({"": "table_hcu.txt"})
    facts = _facts(module_runner, sysfs_root=str(root), hy_smi_path=str(hy_smi))
    assert facts["source"] == "hy-smi"
    assert facts["card_count"] == 8
    assert [c["numa_node"] for c in facts["cards"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert facts["cards"][0]["card_node"] == "/dev/dri/card1"
    assert any("--json exited 1" in e for e in facts["errors"])


def test_sysfs_when_hy_smi_is_absent_and_driver_not_loaded(fake_sysfs, module_runner, tmp_path):
    facts = _facts(module_runner, sysfs_root=str(fake_sysfs(cards=2)), hy_smi_path=str(tmp_path / "no-hy-smi"),
                   dtk_path=str(tmp_path / "no-dtk"))
    assert facts["source"] == "sysfs"
    assert [c["render_node"] for c in facts["cards"]] == ["/dev/dri/renderD128", "/dev/dri/renderD129"]
    assert facts["driver"] == {"loaded": False, "module": None, "version": None}
    assert facts["dtk"] == {"path": None, "version": None}
    assert facts["hyhal"] == {"path": None, "hy_smi": None}


def test_driver_version_from_hy_smi_when_sysfs_has_none(fake_sysfs, fake_hy_smi, module_runner):
    root = fake_sysfs(cards=2, module=("hydcu", ""))
    hy_smi = fake_hy_smi({"--json": "json_dcu_card1_bytes.txt", "--showdriverversion": "driverversion.txt"})
    facts = _facts(module_runner, sysfs_root=str(root), hy_smi_path=str(hy_smi))
    assert facts["driver"] == {"loaded": True, "module": "hydcu", "version": "6.3.30-V1.4.1a"}
    assert facts["cards"][0]["series"] == "Z100L"
