"""hy-smi and sysfs parsing on samples in the formats real hosts print (docs/field-evidence.md names each
sample's source)."""

from __future__ import annotations

import pytest
from modules.sysfs import BW_BDFS, PLATFORM

from ansible_collections.dcu.serving.plugins.module_utils import hysmi

MIB = 1024 * 1024


def _rows(text, json=False):
    return hysmi.smi_cards(hysmi.parse_fields_json(text) if json else hysmi.parse_fields_text(text))


def test_showbus_of_a_bw_box_maps_indexes_to_addresses_out_of_pci_order(sample):
    rows = _rows(sample("showbus_bw1100.txt"))
    assert [r["pci_bus"] for r in rows] == BW_BDFS
    assert [r["pci_bus"] for r in rows] != sorted(BW_BDFS), "the sample is the point: hy-smi is not PCI order"


def test_showtopo_without_a_colon_after_numa_node(sample):
    rows = _rows(sample("showtopo_bw1100.txt"))
    assert [r["numa_node"] for r in rows] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("name", ["rocm_numa_tabs.txt", "rocm_numa_rocm5.txt"])
def test_rocm_smi_line_forms_with_tabs_and_without_brackets(sample, name):
    assert _rows(sample(name))[0]["numa_node"] == 0


def test_json_with_missing_commas_and_empty_keys_from_a_bw_box(sample):
    text = sample("json_bw_missing_commas.txt")
    with pytest.raises(ValueError):
        __import__("json").loads(text)  # the sample really is broken
    rows = _rows(text, json=True)
    assert [r["series"] for r in rows] == ["BW", "BW"]
    assert [r["vram_total_mib"] for r in rows] == [65520, 65520]
    assert rows[1]["vram_used_mib"] == 64104
    fields = hysmi.parse_fields_json(text)
    assert fields[0]["Average GFX Core Power (W)"] == "20.0", "the value after the missing comma survives"


def test_json_pci_bus_with_serial_and_oam_suffixes(sample):
    assert [r["pci_bus"] for r in _rows(sample("json_bw_pci_oam.txt"), json=True)] == ["0000:09:00.0", "0000:36:00.0"]


def test_json_after_a_warning_line_and_split_objects(sample):
    rows = _rows(sample("json_hcu_card0_mib.txt"), json=True)
    assert [r["pci_bus"] for r in rows] == ["0000:04:00.0", "0000:05:00.0", "0000:83:00.0"]
    assert rows[0]["serial"] == "TRCW390010030401"
    split = hysmi.parse_fields_json(sample("json_split.txt"))
    assert split[1]["HCU use (%)"] == "27.5"


def test_json_keys_from_card1_become_index_0_and_bytes_become_mib(sample):
    rows = _rows(sample("json_dcu_card1_bytes.txt"), json=True)
    assert [r["index"] for r in rows] == [0, 1]
    assert rows[0]["vram_total_mib"] == 34342961152 // (1024 * 1024)
    assert rows[1]["pci_bus"] == "0000:06:00.0"


def test_readings_from_json_in_mib_matched_by_address(sample):
    readings = hysmi.smi_readings(hysmi.parse_fields_json(sample("json_hcu_card0_mib.txt")))
    assert readings[1] == {"index": 1, "pci_bus": "0000:05:00.0", "use_percent": 27.5,
                           "vram_total_bytes": 65520 * MIB, "vram_used_bytes": 20413 * MIB,
                           "temperature_c": 61, "power_w": 109}


def test_readings_survive_missing_commas_and_split_objects(sample):
    text = sample("json_bw_pci_oam.txt") + sample("json_bw_missing_commas.txt")  # one object per field group
    readings = hysmi.smi_readings(hysmi.parse_fields_json(text))
    assert [(r["pci_bus"], r["power_w"], r["temperature_c"]) for r in readings] == [
        ("0000:09:00.0", 91, 57), ("0000:36:00.0", 84, 54)], "package power sits before a missing comma"
    assert readings[1]["vram_used_bytes"] == 64104 * MIB


def test_readings_with_dcu_keys_exact_bytes_and_absent_fields(sample):
    readings = hysmi.smi_readings(hysmi.parse_fields_json(sample("json_dcu_card1_bytes.txt")))
    assert readings[0]["use_percent"] == 45
    assert readings[0]["vram_used_bytes"] == 21404581888, "bytes stay exact"
    assert readings[0]["power_w"] is None and readings[0]["temperature_c"] is None, "not asked is not zero"


def test_readings_from_rocm_smi_lines_with_edge_sensor_and_current_power():
    text = ("GPU[0]\t\t: PCI Bus: 0000:03:00.0\n"
            "GPU[0]\t\t: Temperature (Sensor edge) (C): 35.0\n"
            "GPU[0]\t\t: Current Socket Graphics Package Power (W): 41.5\n"
            "GPU[0]\t\t: GPU use (%): 3\n")
    [reading] = hysmi.smi_readings(hysmi.parse_fields_text(text))
    assert (reading["temperature_c"], reading["power_w"], reading["use_percent"]) == (35, 41.5, 3)


@pytest.mark.parametrize("text", ["", "Error: no HCU found\n", '{"version": "1.0"}\n', "{ not json",
                                  "ERROR: Cannot print JSON/CSV output for concise output\n"])
def test_json_without_cards_is_an_error(text):
    with pytest.raises(hysmi.HySmiParseError):
        hysmi.parse_fields_json(text)


def test_meminfo_lines_in_mib_and_bytes(sample):
    assert [r["vram_total_mib"] for r in _rows(sample("showmeminfo_vram_hcu.txt"))] == [65520, 65520, 65520]
    assert _rows(sample("meminfo_gpu_bytes.txt"))[0]["vram_total_mib"] == 34342961152 // (1024 * 1024)


@pytest.mark.parametrize("name, version", [
    ("driverversion.txt", "6.3.30-V1.4.1a"), ("driverversion_6331.txt", "6.3.31-V1.5.0a"),
    ("driverversion_warning_beta.txt", "6.3.31-V1.5.3.beta")])
def test_driver_version(sample, name, version):
    assert hysmi.parse_driver_version(sample(name)) == version


def test_failures_are_explained(sample):
    assert "hymgr" in hysmi.explain_failure("Connect server failed")
    assert "field flags" in hysmi.explain_failure(sample("concise_json_refused.txt"))
    assert hysmi.explain_failure("something else") is None


@pytest.mark.parametrize("name, label, columns", [
    ("table_hcu.txt", "HCU", 8), ("table_dcu_6235.txt", "DCU", 1), ("table_bw_mig.txt", "HCU", 2)])
def test_tables_of_every_generation(sample, name, label, columns):
    found, rows = hysmi.parse_table(sample(name))
    assert found == label
    assert len(rows) == columns
    assert rows[-1]["Mode"] in ("Normal", "MIG")


def test_cpu_and_switch_functions_are_not_cards(fake_sysfs):
    root = fake_sysfs(module=("hycu", "6.3.30-V1.4.1a"), platform=True)
    functions = hysmi.pci_functions(str(root))
    kinds = {f["pci_bus"]: f["kind"] for f in functions}
    assert sum(kind == "card" for kind in kinds.values()) == 8
    assert all(kinds[bdf] == "platform" for bdf, _dev, _cls in PLATFORM)
    assert hysmi.sysfs_cards(functions)[0]["pci_bus"] == "0000:04:00.0"


def test_switch_endpoints_the_driver_binds_are_counted_apart_never_cards(fake_sysfs):
    # Hygon's toolkit enumerates /sys/module/hy*cu/drivers/pci:hy*cu/* and keeps what has DRM nodes: the driver
    # may bind functions that are not cards (field evidence P8). Seven bound a110 endpoints beside 8 cards.
    root = fake_sysfs(module=("hycu", "6.3.30-V1.4.1a"), platform=True, switches_bound=True)
    functions = hysmi.pci_functions(str(root))
    kinds = {f["pci_bus"]: f["kind"] for f in functions}
    switches = [bdf for bdf, dev, _cls in PLATFORM if dev == "0xa110"]
    assert all((root / "bus/pci/devices" / bdf / "driver").exists() for bdf in switches)
    assert [kinds[bdf] for bdf in switches] == ["driver_function"] * 7
    assert len(hysmi.sysfs_cards(functions)) == 8
    assert not [f for f in functions if f["kind"] == "unbound"]


def test_a_card_the_driver_bound_without_drm_nodes_is_down_not_a_card(fake_sysfs):
    # A driver/vbios mismatch leaves K100_AI/BW cards bound and down (field evidence P6, P8): name it.
    functions = hysmi.pci_functions(str(fake_sysfs(cards=2, module=("hycu", "6.3.30-V1.4.1a"), drm=False)))
    cards = [f for f in functions if f["device_id"] == "0x6210"]
    assert [(f["kind"], f["driver"]) for f in cards] == [("unbound", "hycu"), ("unbound", "hycu")]
    assert hysmi.sysfs_cards(functions) == []
    assert hysmi.describe_function(cards[0]) == "0000:04:00.0 (0x6210 K100_AI): driver hycu, no DRM nodes"


def test_cards_without_driver_or_drm_nodes_are_unbound_by_class_or_id(fake_sysfs):
    root = fake_sysfs(cards=2, drm=False)  # driver not loaded yet: no binding, no DRM nodes
    functions = hysmi.pci_functions(str(root))
    assert [f["kind"] for f in functions if f["device_id"] == "0x6210"] == ["unbound", "unbound"]
    assert hysmi.sysfs_cards(functions) == []
    z100l = hysmi.pci_functions(str(fake_sysfs(cards=1, drm=False, device="0x9999", klass="0x038000")))
    assert [f["kind"] for f in z100l if f["device_id"] == "0x9999"] == ["unbound"], "display class, unknown id"


def test_sysfs_index_is_the_drm_order_not_pci_order(fake_sysfs):
    functions = hysmi.pci_functions(str(fake_sysfs(module=("hycu", ""), bdfs=BW_BDFS, drm_base=0)))
    cards = hysmi.sysfs_cards(functions)
    assert [c["pci_bus"] for c in cards] == BW_BDFS
    assert [c["render"] for c in cards] == [f"renderD{128 + i}" for i in range(8)]


@pytest.mark.parametrize("layout", ["real", "flat"])
def test_drm_nodes_follow_the_device_links(fake_sysfs, layout):
    cards = hysmi.sysfs_cards(hysmi.pci_functions(str(fake_sysfs(layout=layout))))
    assert [(c["card"], c["render"]) for c in cards][:2] == [("card1", "renderD128"), ("card2", "renderD129")]
    assert "card0-VGA-1" not in hysmi.drm_nodes(str(fake_sysfs(layout=layout)))


def test_merge_matches_by_address_and_reports_disagreements(fake_sysfs, sample):
    functions = hysmi.pci_functions(str(fake_sysfs(module=("hycu", ""), bdfs=sorted(BW_BDFS), drm_base=0)))
    rows = _rows(sample("showbus_bw1100.txt"))
    cards, problems = hysmi.merge(functions, rows)
    assert problems == []
    assert [c["pci_bus"] for c in cards] == BW_BDFS, "index follows hy-smi, whatever sysfs's order"
    by_bus = {c["pci_bus"]: c for c in cards}
    # renderD numbers follow the sysfs (DRM) order, here PCI order: hy-smi's index 1 (2b:00.0) is renderD131.
    assert by_bus["0000:2b:00.0"]["index"] == 1
    assert by_bus["0000:2b:00.0"]["render_node"] == "/dev/dri/renderD131"
    cards, problems = hysmi.merge(functions, [*rows[:7], dict(rows[7], pci_bus="0000:ee:00.0")])
    assert len(cards) == 8 and cards[-1]["pci_bus"] == "0000:9e:00.0"
    assert any("0000:ee:00.0" in p for p in problems) and any("does not list" in p for p in problems)


def test_hy_smi_numa_wins_over_old_kernels_zeros(fake_sysfs, sample):
    functions = hysmi.pci_functions(str(fake_sysfs(module=("hycu", ""), bdfs=BW_BDFS, drm_base=0, numa=[0] * 8)))
    rows = [dict(bus, numa_node=topo["numa_node"]) for bus, topo in
            zip(_rows(sample("showbus_bw1100.txt")), _rows(sample("showtopo_bw1100.txt")), strict=True)]
    cards, _ = hysmi.merge(functions, rows)
    assert [c["numa_node"] for c in cards] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_loaded_driver_with_and_without_a_version_file(fake_sysfs):
    assert hysmi.loaded_driver(str(fake_sysfs(module=("hycu", "6.3.30-V1.4.1a")))) == ("hycu", "6.3.30-V1.4.1a")
    assert hysmi.loaded_driver(str(fake_sysfs(module=("hydcu", "6.2.35")))) == ("hydcu", "6.2.35")
    assert hysmi.loaded_driver(str(fake_sysfs(module=("hycu", "")))) == ("hycu", None)
    assert hysmi.loaded_driver(str(fake_sysfs())) == (None, None)
