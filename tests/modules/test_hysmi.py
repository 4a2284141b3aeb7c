"""hy-smi and sysfs parsing on samples in the formats real hosts print (shared/reference/dcu-host.md)."""

from __future__ import annotations

import pytest

from ansible_collections.dcu.serving.plugins.module_utils import hysmi


def test_json_hcu_card0_with_banner_serial_suffix_and_mib(sample):
    cards = hysmi.parse_json(sample("json_hcu_card0_mib.txt"))
    assert [c["index"] for c in cards] == [0, 1, 2]
    assert [c["pci_bus"] for c in cards] == ["0000:04:00.0", "0000:05:00.0", "0000:83:00.0"]
    assert [c["numa_node"] for c in cards] == [0, 0, 1]
    assert cards[1]["series"] == "K100_AI"
    assert cards[1]["vram_total_mib"] == 65520
    assert cards[1]["vram_used_mib"] == 20413
    assert cards[0]["serial"] == "TRCW390010030401"


def test_json_dcu_card1_based_bytes_and_trailing_lines(sample):
    cards = hysmi.parse_json(sample("json_dcu_card1_bytes.txt"))
    assert [c["index"] for c in cards] == [0, 1], "card1-based keys must become index 0"
    assert cards[0]["vram_total_mib"] == 34342961152 // (1024 * 1024)
    assert cards[0]["vram_used_mib"] == 21404581888 // (1024 * 1024)
    # A bus without domain and with a serial suffix is normalised.
    assert cards[1]["pci_bus"] == "0000:06:00.0"
    assert cards[1]["series"] == "Z100L"
    assert cards[1]["numa_node"] == 1


def test_json_objects_printed_one_after_another_are_merged(sample):
    cards = hysmi.parse_json(sample("json_split.txt"))
    assert len(cards) == 2
    assert cards[1]["raw"]["HCU use (%)"] == "27.5"
    assert cards[1]["vram_total_mib"] == 65520
    assert cards[0]["pci_bus"] is None


@pytest.mark.parametrize("text", ["", "Error: no HCU found\n", '{"version": "1.0"}\n', "{ not json"])
def test_json_without_cards_is_an_error(text):
    with pytest.raises(hysmi.HySmiParseError):
        hysmi.parse_json(text)


def test_table_hcu_header(sample):
    label, rows = hysmi.parse_table(sample("table_hcu.txt"))
    assert label == "HCU"
    assert [r["index"] for r in rows] == list(range(8))
    assert rows[3]["HCU%"] == "27.5%"
    assert rows[3]["VRAM%"] == "31%"


def test_table_dcu_header_of_older_drivers(sample):
    label, rows = hysmi.parse_table(sample("table_dcu.txt"))
    assert label == "DCU"
    assert [r["index"] for r in rows] == [0, 1]
    assert rows[1]["DCU%"] == "45%"


def test_table_without_header_is_an_error(sample):
    with pytest.raises(hysmi.HySmiParseError):
        hysmi.parse_table(sample("memavailable_hcu.txt"))


def test_memavailable_mib_and_bytes(sample):
    assert hysmi.parse_memavailable(sample("memavailable_hcu.txt")) == {0: 65438, 1: 45107}
    assert hysmi.parse_memavailable(sample("memavailable_dcu_bytes.txt")) == {
        0: 34256732160 // (1024 * 1024), 1: 12938379264 // (1024 * 1024)}


def test_show_all_card_lines(sample):
    cards = hysmi.parse_card_lines(sample("showall_hcu.txt"))
    assert cards[0]["Card Series"] == "K100_AI"
    assert cards[0]["Card Vendor"] == "Chengdu Haiguang IC Design Co., Ltd."
    assert cards[1]["PCI Bus"] == "0000:05:00.0"


def test_driver_version(sample):
    assert hysmi.parse_driver_version(sample("driverversion.txt")) == "6.3.30-V1.4.1a"
    assert hysmi.parse_driver_version("nothing here") is None


@pytest.mark.parametrize("layout", ["real", "flat"])
def test_sysfs_maps_nodes_by_pci_address_not_by_card_number(fake_sysfs, layout, dcu_bdfs):
    root = fake_sysfs(layout=layout)
    cards = hysmi.discover_sysfs(str(root))
    assert [c["pci_bus"] for c in cards] == dcu_bdfs, "the onboard VGA (vendor 0x1a03) is not a DCU"
    assert cards[0]["card"] == "card1" and cards[0]["render"] == "renderD128"
    assert cards[7]["card"] == "card8" and cards[7]["render"] == "renderD135"
    assert [c["numa_node"] for c in cards] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {c["series"] for c in cards} == {"K100_AI"}
    assert {c["vram_total_mib"] for c in cards} == {65520}


def test_sysfs_card_without_render_node(fake_sysfs):
    cards = hysmi.discover_sysfs(str(fake_sysfs(cards=2, render_missing=(1,))))
    assert cards[1]["render"] is None and cards[1]["card"] == "card2"


def test_sysfs_missing_root_gives_no_cards(tmp_path):
    assert hysmi.discover_sysfs(str(tmp_path / "absent")) == []


def test_loaded_driver_hycu_and_hydcu(fake_sysfs):
    assert hysmi.loaded_driver(str(fake_sysfs(module=("hycu", "6.3.30-V1.4.1a")))) == ("hycu", "6.3.30-V1.4.1a")
    assert hysmi.loaded_driver(str(fake_sysfs(module=("hydcu", "6.2.26")))) == ("hydcu", "6.2.26")
    assert hysmi.loaded_driver(str(fake_sysfs())) == (None, None)


def test_merge_json_cards_by_pci_address(fake_sysfs, sample):
    sysfs = hysmi.discover_sysfs(str(fake_sysfs(numa=[0] * 8)))  # old kernels: 0 for every card
    merged = hysmi.merge_cards(sysfs, smi_cards=hysmi.parse_json(sample("json_hcu_card0_mib.txt")))
    third = merged[2]
    assert third["pci_bus"] == "0000:83:00.0"
    # 0000:83:00.0 is the fifth DCU in PCI order: its nodes come from sysfs, its NUMA node from hy-smi.
    assert third["card_node"] == "/dev/dri/card5" and third["render_node"] == "/dev/dri/renderD132"
    assert third["numa_node"] == 1


def test_merge_table_rows_by_position(fake_sysfs, sample):
    sysfs = hysmi.discover_sysfs(str(fake_sysfs()))
    merged = hysmi.merge_cards(sysfs, table_rows=hysmi.parse_table(sample("table_hcu.txt"))[1])
    assert [c["render_node"] for c in merged] == [f"/dev/dri/renderD{128 + i}" for i in range(8)]
    assert merged[5]["pci_bus"] == "0000:84:00.0" and merged[5]["numa_node"] == 1


@pytest.mark.parametrize(("text", "bdf"), [
    ("0000:06:00.0 --> SN: TRCW390010030401", "0000:06:00.0"),
    ("06:00.0", "0000:06:00.0"),
    ("0000:8C:00.0", "0000:8c:00.0"),
    ("N/A", None),
    (None, None),
])
def test_normalize_bdf(text, bdf):
    assert hysmi.normalize_bdf(text) == bdf
