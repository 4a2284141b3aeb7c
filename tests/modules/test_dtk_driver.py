"""Hygon's DTK <-> driver table as data, and the check an image's DTK passes before it starts
(plugins/module_utils/dtk_driver.py, plugins/plugin_utils/dtk_check.py). Driver spellings are the ones hosts print
(docs/field-evidence.md): installer names, hy-smi's 6.3.31-V1.5.0a, sysfs's bare 6.2.35."""

from __future__ import annotations

import pytest

from ansible_collections.dcu.serving.plugins.module_utils import dtk_driver
from ansible_collections.dcu.serving.plugins.plugin_utils.dtk_check import dtk_driver_check, dtk_driver_row

IMAGE_2604 = "harbor.sourcefind.cn:5443/dcu/admin/base/vllm:0.11.0-ubuntu22.04-dtk26.04-py3.10"
IMAGE_25041 = "image.sourcefind.cn:5000/dcu/admin/base/vllm:0.8.5-ubuntu22.04-dtk25.04.1-py3.10"


@pytest.mark.parametrize("text, version", [
    ("26.04", "26.04"),
    ("24.04.3", "24.04.3"),
    (IMAGE_2604, "26.04"),
    (IMAGE_25041, "25.04.1"),
    ("/opt/dtk-26.04-DCC2602-0317", "26.04"),
    ("DTK-24.04.1-CentOS7.6-x86_64.tar.gz", "24.04.1"),
    ("vllm:0.11.0-ubuntu22.04-py3.10", None),
    ("", None),
])
def test_dtk_versions_from_images_paths_and_files(text, version):
    assert dtk_driver.dtk_version(text) == version


def test_every_row_keeps_the_vendors_text_and_a_reading():
    assert [r["dtk"] for r in dtk_driver.ROWS][:8] == ["26.04", "25.04.2", "25.04.1", "25.04",
                                                       "24.04.3", "24.04.2", "24.04.1", "24.04"]
    for entry in dtk_driver.ROWS:
        assert entry["requirement"] and entry["shipped"] and entry["ranges"]
    # The row's own driver always satisfies it (where the shipped installer names a single driver).
    for entry in dtk_driver.ROWS[:8]:
        assert dtk_driver.supports(entry, entry["shipped"]) is True, entry["dtk"]


@pytest.mark.parametrize("dtk, driver, allowed", [
    ("26.04", "6.3.30-V1.4.1a", True),
    ("26.04", "6.3.31-V1.5.0a", True),  # newer than the snapshot, still >=
    ("26.04", "6.3.31-V1.5.3.beta", True),
    ("26.04", "6.3.30", True),  # hy-smi's short spelling: not provably older
    ("26.04", "6.3.30-V1.4.0", False),
    ("26.04", "6.3.27-V1.2.5", False),
    ("25.04.2", "6.3.27-V1.2.5", True),
    ("25.04.2", "6.3.6-V1.9.0c", False),  # 1.9.0c > 1.1.0a, but the base decides
    ("25.04.1", "6.3.16-V1.1.0a", True),
    # ">=5.7.1-V1.7.0": a 6.2 aio driver of build >= 1.7.0, or any 6.3 driver
    ("25.04", "6.3.3-V1.8.0", True),
    ("25.04", "6.3.16-V1.1.0a", True),  # restarted V-numbering, newer line
    ("25.04", "5.7.1-6.2.35-V1.6.7", False),
    ("25.04", "6.2.35", False),  # sysfs's bare base: its installer carried V1.6.7
    ("25.04", "5.16.18", False),
    # ">=5.7.1-V1.0 且 <=5.7.1-V1.6.3": the 6.2 aio drivers up to build 1.6.3; no 6.3 driver
    ("24.04.3", "rock-5.7.1-6.2.26-V1.5.aio.run", True),
    ("24.04.3", "6.2.26", True),
    ("24.04.1", "6.2.17a", None),  # a 6.2 base whose installer build is not known: cannot tell
    ("24.04.3", "5.7.1-6.2.35-V1.6.7", False),  # the upper bound (field evidence: outside it)
    ("24.04.3", "6.2.35", False),
    ("24.04.3", "6.3.30-V1.4.1a", False),
    ("23.10", "5.16.18", True),
    ("23.10", "5.16.29", True),
    ("23.10", "5.11.40", False),
    ("23.04", "5.11.40", True),
    ("23.04", "6.2.18", True),
    ("23.04", "6.2.26", False),
    ("22.04", "5.11.32", True),
    ("22.04", "5.11.34", False),
])
def test_requirements_as_read(dtk, driver, allowed):
    assert dtk_driver.supports(dtk_driver.row(dtk), driver) is allowed


def test_dtks_a_driver_supports():
    assert dtk_driver.dtks_for("6.3.16-V1.1.0a") == ["25.04.2", "25.04.1", "25.04"]
    assert dtk_driver.dtks_for("6.2.26-V1.5") == ["24.04.3", "24.04.2", "24.04.1", "24.04", "23.10.1", "23.10"]


def test_a_matching_image_and_host_pass():
    assert dtk_driver_check(IMAGE_2604, "6.3.31-V1.5.0a", "26.04") == ""
    assert dtk_driver_check("26.04", "6.3.30-V1.4.1a") == ""


def test_an_image_newer_than_the_driver_is_refused_naming_the_row_the_image_the_driver_and_the_fix():
    message = dtk_driver_check(IMAGE_2604, "6.3.16-V1.1.0a", "26.04")  # the host's DTK, the same row: said once
    assert message.count("Fix:") == 1
    assert message.startswith(f"image {IMAGE_2604} (DTK 26.04): the DTK <-> driver table's row DTK-26.04: "
                              "driver >=6.3.30-V1.4.1a (shipped with rock-6.3.30-V1.4.1a.run) does not allow the "
                              "host's driver 6.3.16-V1.1.0a.")
    assert "Fix: install a driver that row allows (DTK 26.04 shipped with rock-6.3.30-V1.4.1a.run)" in message
    assert "or use a DTK this driver supports (DTK 25.04.2, 25.04.1, 25.04)" in message


def test_dtk_2404_has_an_upper_bound():
    message = dtk_driver_check("24.04.3", "5.7.1-6.2.35-V1.6.7", image="vllm:0.6.2-dtk24.04.3")
    assert "image vllm:0.6.2-dtk24.04.3 (DTK 24.04.3)" in message
    assert ">=5.7.1-V1.0 且 <=5.7.1-V1.6.3" in message and "none in the table" in message


def test_the_hosts_own_dtk_is_checked_too():
    message = dtk_driver_check(IMAGE_2604, "6.3.30-V1.4.1a", "24.04.3")
    assert message.startswith("the host's DTK 24.04.3: the DTK <-> driver table's row DTK-24.04.3")
    assert "DTK 26.04" in message  # what this driver supports


def test_unknown_is_not_refused_unless_strict():
    assert dtk_driver_check("26.04.1", "6.3.31-V1.5.0a") == ""  # 26.04.1 differs from 26.04: not guessed
    assert dtk_driver_check(IMAGE_2604, None) == ""
    assert dtk_driver_check("24.04.1", "6.2.17a") == ""
    strict = dtk_driver_check("26.04.1", "6.3.31-V1.5.0a", strict=True)
    assert "DTK 26.04.1 is not in the DTK <-> driver table" in strict and "Fix:" in strict
    assert "driver version is unknown" in dtk_driver_check(IMAGE_2604, "", strict=True)
    assert "no DTK version found" in dtk_driver_check("vllm:latest", "6.3.30", strict=True)
    assert "cannot be decided" in dtk_driver_check("24.04.1", "6.2.17a", strict=True)


def test_the_row_as_data_for_docs_and_messages():
    entry = dtk_driver_row(IMAGE_25041)
    assert entry["requirement"] == ">=6.3.6-V1.9.0c" and "sourcefind" in entry["source"]
    assert "2026" in entry["snapshot"]
    assert dtk_driver_row("99.99") == {}


def test_runtime_host_mounts_the_hosts_dtk_over_the_images():
    assert dtk_driver_check(IMAGE_2604, "6.3.31-V1.5.0a", "26.04", runtime="host") == ""
    assert dtk_driver_check(IMAGE_25041, "6.3.31-V1.5.0a", "26.04", runtime="host") == (
        f"image {IMAGE_25041} was built on DTK 25.04.1, but runtime host mounts the host's DTK 26.04 over it. Fix: "
        "set the service's runtime to image (the default: the image's own DTK with the host's hyhal, Hygon's "
        "recipe), or use an image built on DTK 26.04.")
    assert "the host has none" in dtk_driver_check(IMAGE_2604, "6.3.31-V1.5.0a", None, runtime="host")
    assert dtk_driver_check(IMAGE_25041, "6.3.31-V1.5.0a", "26.04", runtime="bundled") == ""
    assert dtk_driver_check(IMAGE_25041, "6.3.31-V1.5.0a", "26.04", runtime="image") == "", "the image's own DTK"
