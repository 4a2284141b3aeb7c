"""Deciding "installed" and "reboot needed" from the rock driver's version strings as real hosts print them
(installer names, rpm and deb packages, hy-smi, sysfs: docs/field-evidence.md)."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.module_utils import rock_version
from ansible_collections.dcu.serving.plugins.plugin_utils import cards as dcu_cards
from ansible_collections.dcu.serving.plugins.plugin_utils import rock

ARTIFACT = {"file": "driver/rock-6.3.27-V1.2.5.run", "sha256": "ab" * 32, "version": "6.3.27-V1.2.5"}


@pytest.mark.parametrize("text, base, build", [
    ("rock-6.3.27-V1.2.5.run", "6.3.27", "1.2.5"),
    ("rock-6.3.30-V1.4.1a.run", "6.3.30", "1.4.1a"),
    ("rock-5.7.1-6.2.26-V1.5.aio.run", "6.2.26", "1.5"),  # the DTK version comes first in aio names
    ("rock-5.7.1-6.2.35-V1.6.7.aio.run", "6.2.35", "1.6.7"),
    ("Driver Version: 6.3.31-V1.5.0a", "6.3.31", "1.5.0a"),
    ("Driver Version: 6.3.31-V1.5.3.beta", "6.3.31", "1.5.3.beta"),
    ("6.2.28", "6.2.28", None),
    ("6.2.17a", "6.2.17a", None),
])
def test_versions_from_every_source(text, base, build):
    assert rock_version.parse(text) == {"base": base, "build": build}


@pytest.mark.parametrize("version, release, expected", [
    ("6.3.27", "1.2.5", {"base": "6.3.27", "build": "1.2.5"}),  # rpm rock-6.3.27-1.2.5: the release is the build
    ("6.2.18", "1", {"base": "6.2.18", "build": None}),  # rpm rock-5.7.1-6.2.18-1: the release is a release
    ("6.2.35", None, {"base": "6.2.35", "build": None}),  # deb rock-5.7.1 6.2.35
    ("6.3.30-V1.4.1a", None, {"base": "6.3.30", "build": "1.4.1a"}),  # deb rock 6.3.30-V1.4.1a
])
def test_package_versions(version, release, expected):
    assert rock_version.parse_package(version, release) == expected


@pytest.mark.parametrize("a, b, same", [
    ("6.3.27-V1.2.5", "6.3.27", True),  # hy-smi printing only the base
    ("6.3.27-V1.2.5", "6.3.27-V1.2.6", False),
    ("6.3.27-V1.2.5", "6.3.30-V1.4.1a", False),
    ("6.2.17a", "6.2.17", False),
    (None, "6.3.27", None),  # unknown is not a difference
])
def test_same_driver(a, b, same):
    assert rock_version.same(a, b) is same


def _query(*lines):
    return "\n".join("\t".join(line) for line in lines) + "\n"


def test_rock_packages_from_dpkg_and_rpm_queries():
    packages = rock.rock_packages(_query(("installed", "rock-5.7.1", "6.2.35"),
                                         ("installed", "rocksdb-tools", "8.1"),
                                         ("config-files", "rock", "6.3.27-V1.2.5"),
                                         ("installed", "rock", "6.3.27", "1.2.5")))
    assert [(p["name"], p["version"]) for p in packages] == [("rock-5.7.1", "6.2.35"), ("rock", "6.3.27-1.2.5")]
    assert packages[1]["parsed"] == {"base": "6.3.27", "build": "1.2.5"}


def test_installed_by_the_record_whatever_the_package_says():
    packages = rock.rock_packages(_query(("installed", "rock", "6.3.27", "1.2.5")))
    record = {"sha256": ARTIFACT["sha256"], "package": {"name": "rock", "version": "6.3.27-1.2.5"}}
    state = rock.rock_install_state(packages, record, ARTIFACT)
    assert state["installed"] and not state["adopt"]


def test_the_installers_package_is_recorded_however_it_spells_its_version():
    """Whether a 6.3 rpm is named rock-6.3.27 with version 1.2.5 is not known: the record takes the package
    that appeared with the install, and the next run recognises it by that record."""
    before = rock.rock_packages(_query(("installed", "rock-5.7.1", "6.2.35")))
    after = rock.rock_packages(_query(("installed", "rock-6.3.27", "1.2.5")))
    package = rock.rock_package_of(after, ARTIFACT["version"], before)
    assert package == {"name": "rock-6.3.27", "version": "1.2.5"}
    state = rock.rock_install_state(after, {"sha256": ARTIFACT["sha256"], "package": package}, ARTIFACT)
    assert state["installed"] and not state["adopt"]


def test_installed_without_a_record_is_adopted_by_a_normalised_compare():
    packages = rock.rock_packages(_query(("installed", "rock", "6.3.27-1.2.5")))  # deb spelling of rpm's VR
    state = rock.rock_install_state(packages, {}, ARTIFACT)
    assert state["installed"] and state["adopt"]


@pytest.mark.parametrize("query, record", [
    (_query(("installed", "rock-5.7.1", "6.2.35")), {}),  # an older driver
    ("", {"sha256": ARTIFACT["sha256"], "package": {"name": "rock"}}),  # recorded, then purged by hand
    (_query(("installed", "rock", "6.3.27", "1.2.6")), {"sha256": "cd" * 32, "package": {"name": "rock"}}),
])
def test_not_installed(query, record):
    state = rock.rock_install_state(rock.rock_packages(query), record, ARTIFACT)
    assert not state["installed"]
    assert state["reason"]


def test_install_state_needs_a_whole_artifact():
    with pytest.raises(AnsibleFilterError):
        rock.rock_install_state([], {}, {"file": "x"})


@pytest.mark.parametrize("driver, reasons", [
    ({"loaded": True, "module": "hycu", "version": None}, 0),  # no version file: not provably different
    ({"loaded": True, "module": "hycu", "version": "6.3.27"}, 0),  # hy-smi's short spelling
    ({"loaded": True, "module": "hycu", "version": "6.3.27-V1.2.5"}, 0),
    ({"loaded": True, "module": "hycu", "version": "6.3.16-V1.1.0a"}, 1),  # an older 6.3 still loaded
    ({"loaded": True, "module": "hydcu", "version": None}, 1),  # the 6.2 module still loaded
    ({"loaded": False, "module": None, "version": None}, 0),
])
def test_reboot_only_when_the_loaded_module_provably_differs(driver, reasons):
    assert len(rock.rock_reboot_reasons(driver, "6.3.27-V1.2.5")) == reasons


def test_module_names():
    assert rock.rock_module("5.7.1-6.2.26-V1.5") == "hydcu"
    assert rock.rock_module("6.3.30-V1.4.1a") == "hycu"
    with pytest.raises(AnsibleFilterError):
        rock.rock_module("latest")


def test_card_problem_names_each_card_and_the_unbound_ones():
    facts = {"source": "hy-smi-json", "platform_functions": 62, "errors": [],
             "cards": [{"index": 0, "pci_bus": "0000:05:00.0", "series": "BW", "driver": "hycu",
                        "card_node": "/dev/dri/card0", "render_node": "/dev/dri/renderD128"}],
             "unbound": [{"pci_bus": "0000:2b:00.0",
                          "summary": "0000:2b:00.0 (0x6430 BW1100): driver none, no DRM nodes"}]}
    message = dcu_cards.dcu_card_problem(facts, 2, variable="dcu_driver_expected_cards")
    assert "shows 1 DCU card, dcu_driver_expected_cards expects 2" in message
    assert "card 0 at 0000:05:00.0 (BW): driver hycu, DRM card0+renderD128" in message
    assert "not up: 0000:2b:00.0 (0x6430 BW1100): driver none, no DRM nodes" in message
    assert "62 other vendor 0x1d94 PCI functions" in message and "Fix:" in message
    assert dcu_cards.dcu_card_problem(facts, 1) == ""
    assert "names card 3" in dcu_cards.dcu_card_problem(facts, 0, [0, 3], variable="dcu_vllm_cards")


@pytest.mark.parametrize("a, b, order", [
    ("6.3.30-V1.4.1a", "6.3.16-V1.1.0a", 1),  # the base decides, whatever the builds (V-numbering restarted)
    ("6.3.6-V1.9.0c", "6.3.16-V1.1.0a", -1),
    ("6.2.17", "6.2.17a", -1),  # the letter orders after the bare number
    ("6.2.17a", "6.2.18", -1),
    ("6.3.27-V1.2.5", "6.3.27-V1.2.6", -1),
    ("6.3.31-V1.5.3.beta", "6.3.31-V1.5.3", -1),  # a pre-release before its release
    ("6.3.31-V1.5.3.beta", "6.3.31-V1.5.0a", 1),
    ("6.3.30-V1.4.1", "6.3.30-V1.4.1a", -1),
    ("rock-5.2.0-5.16.18-V01.9.2.run", "5.16.18-V1.9.2", 0),  # V01.9.2 is build 1.9.2
    ("6.2.26-V1.5", "6.2.26-V1.5.0", 0),
    ("6.2.26-V1.5", "6.2.26-V1.5.0a", -1),
    ("6.2.26-V1.5", "6.2.26-V1.5.1", -1),
    ("6.3.30", "6.3.30-V1.4.1a", 0),  # hy-smi's short spelling can be any build of its base
    ("rock-5.7.1-6.2.26-V1.5.aio.run", "6.3.3-V1.8.0", -1),  # the aio name's DTK prefix is not the driver
    ("10.0.0", "9.9.9", 1),  # numbers, not text
    (None, "6.3.30", None),
    ("latest", "6.3.30", None),
])
def test_compare_orders_driver_versions(a, b, order):
    assert rock_version.compare(a, b) == order
    if order is not None:
        assert rock_version.compare(b, a) == -order
