# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Which rock driver each DTK needs: Hygon's DTK <-> driver table, as data, and the check against it.

Source: Hygon's "DTK与驱动版本配套关系表.md" (https://download.sourcefind.cn:65024/file/1/DTK与驱动版本配套关系表.md),
read through a third-party snapshot quoted in a 2026 skill package (dcu-dtk SKILL.md); the official page was
not reachable. The snapshot is undated: its newest row is DTK 26.04 with rock-6.3.30-V1.4.1a, and hosts
already run newer drivers (6.3.31-V1.5.0a), so the table lags the vendor's. Hygon says the table changes and
that 26.04 and 26.04.1 differ: a DTK missing here is unknown, never guessed from a neighbour.

How a requirement is read (REQUIREMENT keeps the vendor's text verbatim; `ranges` is this reading of it):
- "6.3.30-V1.4.1a": the driver base 6.3.30 and its build, ordered by rock_version.compare (base first;
  builds only within a base, because Hygon restarted the V-numbering at 6.3.16).
- "5.7.1-V1.7.0": the 5.7.1 "aio" installers (rock-5.7.1-6.2.26-V1.5.aio.run: DTK-5.7.1 bundle, driver
  6.2.26, build V1.5) are numbered by their build; "5.7.1-V<b>" is the 6.2 driver line at build <b>.
  So ">=5.7.1-V1.7.0" is a 6.2 driver of build >= 1.7.0 or any newer line (6.3 and later), and
  "<=5.7.1-V1.6.3" a 6.2 driver of build <= 1.6.3 (6.3 drivers are excluded: DTK 24.04.x has an upper
  bound). A 6.2 driver printed without its build (sysfs: 6.2.35) takes the build its published installer
  carries (AIO_BUILDS), else the answer is unknown.
- "4.5.2-5.11.38 / ...": alternatives; an alternative spelled with an older line's version covers that
  line only (5.11.x from 5.11.38), since the next alternative names the 6.2 drivers separately.
- "仅支持当前一个驱动版本" (only the driver it shipped with): that driver base exactly.
"""

import re

try:
    from ansible_collections.dcu.serving.plugins.module_utils import rock_version
except ImportError:  # outside Ansible, as dcu_serving.dtk_driver (a symlink in src/dcu_serving)
    from dcu_serving import rock_version

SOURCE = ("Hygon DTK与驱动版本配套关系表 (https://download.sourcefind.cn:65024/file/1/"
          "DTK%E4%B8%8E%E9%A9%B1%E5%8A%A8%E7%89%88%E6%9C%AC%E9%85%8D%E5%A5%97%E5%85%B3%E7%B3%BB%E8%A1%A8.md), "
          "via the snapshot quoted in the dcu-dtk skill package")
SNAPSHOT = "undated snapshot, newest row DTK 26.04 / rock-6.3.30-V1.4.1a; transcribed 2026-12-01"

# The build each published 5.7.1 aio installer of a 6.2 driver base carries (installer names in the table;
# 6.2.35-V1.6.7 from docs/field-evidence.md), for drivers that print their base only.
AIO_BUILDS = {"6.2.13": "1.0.1a", "6.2.17": "1.1.1", "6.2.18": "1.1.2", "6.2.26": "1.5", "6.2.35": "1.6.7"}

_AIO = {"min": "aio:1.0", "max": "aio:1.6.3"}
_OLD_62 = {"min": "6.2.13a", "max": "6.2.18"}

# dtk, the driver shipped with it, the requirement as the vendor wrote it, hardware, and its reading.
ROWS = [
    {"dtk": "26.04", "shipped": "rock-6.3.30-V1.4.1a.run", "requirement": ">=6.3.30-V1.4.1a",
     "hardware": "BW, K100_AI, K100, Z100L", "ranges": [{"min": "6.3.30-V1.4.1a"}]},
    {"dtk": "25.04.2", "shipped": "rock-6.3.16-V1.1.0a.run", "requirement": ">=6.3.16-V1.1.0a",
     "hardware": "BW, K100_AI, K100, Z100L", "ranges": [{"min": "6.3.16-V1.1.0a"}]},
    {"dtk": "25.04.1", "shipped": "rock-6.3.6-V1.9.0c.run", "requirement": ">=6.3.6-V1.9.0c",
     "hardware": "BW, K100_AI, K100, Z100L", "ranges": [{"min": "6.3.6-V1.9.0c"}]},
    {"dtk": "25.04", "shipped": "rock-6.3.3-V1.8.0.run", "requirement": ">=5.7.1-V1.7.0",
     "hardware": "BW, K100_AI, K100, Z100L", "ranges": [{"min": "aio:1.7.0"}]},
    {"dtk": "24.04.3", "shipped": "rock-5.7.1-6.2.26-V1.5.aio.run", "requirement": ">=5.7.1-V1.0 且 <=5.7.1-V1.6.3",
     "hardware": "K100_AI, K100, Z100L", "ranges": [_AIO]},
    {"dtk": "24.04.2", "shipped": "rock-5.7.1-6.2.18-V1.1.2.aio.run", "requirement": ">=5.7.1-V1.0 且 <=5.7.1-V1.6.3",
     "hardware": "K100_AI, K100, Z100L", "ranges": [_AIO]},
    {"dtk": "24.04.1", "shipped": "rock-5.7.1-6.2.17-V1.1.1.aio.run", "requirement": ">=5.7.1-V1.0 且 <=5.7.1-V1.6.3",
     "hardware": "K100_AI, K100, Z100L", "ranges": [_AIO]},
    {"dtk": "24.04", "shipped": "rock-5.7.1-6.2.13-V1.0.1a.aio.run", "requirement": ">=5.7.1-V1.0 且 <=5.7.1-V1.6.3",
     "hardware": "K100_AI, K100, Z100L", "ranges": [_AIO]},
    # "V10.9.2" is read as the V01.9.2 of the installer the row ships (rock-5.2.0-5.16.18-V01.9.2.run).
    {"dtk": "23.10.1", "shipped": "rock-5.2.0-5.16.18-V01.9.2.run",
     "requirement": ">=5.2.0-V10.9.2 / >=5.7.1-V1.0 且 <=5.7.1-V1.6.3", "hardware": "K100, Z100L",
     "ranges": [{"line": "5.16", "min": "5.16.18"}, _AIO]},
    {"dtk": "23.10", "shipped": "rock-5.2.0-5.16.18-V01.9.2.run",
     "requirement": ">=5.2.0-5.16.18 / >=5.7.1-V1.0 且 <=5.7.1-V1.6.3", "hardware": "K100, Z100L",
     "ranges": [{"line": "5.16", "min": "5.16.18"}, _AIO]},
    # Two rows in the table: K100 with the 5.2.0 installer, Z100L with rock-4.5.2-5.11.40-V01.8.1.run.
    {"dtk": "23.04.1", "shipped": "rock-5.2.0-5.16.18-V01.9.2.run (K100), rock-4.5.2-5.11.40-V01.8.1.run (Z100L)",
     "requirement": ">=5.2.0-5.16.18 (K100) / >=4.5.2-5.11.38 (Z100L) / >=5.7.1-6.2.13a 且 <=5.7.1-6.2.18",
     "hardware": "K100, Z100L",
     "ranges": [{"line": "5.16", "min": "5.16.18"}, {"line": "5.11", "min": "5.11.38"}, _OLD_62]},
    {"dtk": "23.04", "shipped": "rock-4.5.2-5.11.39-V01.5.run",
     "requirement": ">=4.5.2-5.11.38 / >=5.7.1-6.2.13a 且 <=5.7.1-6.2.18", "hardware": "Z100L",
     "ranges": [{"line": "5.11", "min": "5.11.38"}, _OLD_62]},
    {"dtk": "22.10.1", "shipped": "rock-4.5.2-5.11.38-V01.4.2.1a.run",
     "requirement": ">=4.5.2-5.11.38 / >=5.7.1-6.2.13a 且 <=5.7.1-6.2.18", "hardware": "Z100L",
     "ranges": [{"line": "5.11", "min": "5.11.38"}, _OLD_62]},
    {"dtk": "22.10", "shipped": "rock-4.5.2-0-5.11.36-1-V01.3.2.run",
     "requirement": ">=4.5.2-5.11.36 / >=5.7.1-6.2.13a 且 <=5.7.1-6.2.18", "hardware": "Z100L",
     "ranges": [{"line": "5.11", "min": "5.11.36"}, _OLD_62]},
    {"dtk": "22.04.2", "shipped": "rock-kernel-refactory-rock-4.5.2-0-5.11.34-V01.3.run",
     "requirement": "仅支持当前一个驱动版本 (only the driver it shipped with)", "hardware": "Z100L",
     "ranges": [{"exact": "5.11.34"}]},
    {"dtk": "22.04.1", "shipped": "rock-4.5.2-0-5.11.32-Linux.rpm",
     "requirement": "仅支持当前一个驱动版本 (only the driver it shipped with)", "hardware": "Z100L",
     "ranges": [{"exact": "5.11.32"}]},
    {"dtk": "22.04", "shipped": "rock-4.5.2-0-5.11.32-Linux.rpm",
     "requirement": "仅支持当前一个驱动版本 (only the driver it shipped with)", "hardware": "Z100L",
     "ranges": [{"exact": "5.11.32"}]},
    {"dtk": "21.10.1", "shipped": "rock-4.0-23-5.6.25-3.10.0-957.el7.x86_64.rpm",
     "requirement": "仅支持当前一个驱动版本 (only the driver it shipped with)", "hardware": "Z100L",
     "ranges": [{"exact": "5.6.25"}]},
]

_DTK_IN_TEXT = re.compile(r"(?i)(?:^|[^a-z0-9])dtk[-_]?(\d{2}\.\d{2}(?:\.\d+)?)(?![\d])")
_DTK_VERSION = re.compile(r"^\s*(\d{2}\.\d{2}(?:\.\d+)?)(?![\d])")


def dtk_version(text):
    """'26.04' from '26.04', 'vllm:0.11.0-ubuntu22.04-dtk26.04-py3.10' or '/opt/dtk-24.04.3'; else None."""
    if not text:
        return None
    text = str(text)
    match = _DTK_IN_TEXT.search(text) or _DTK_VERSION.match(text)
    return match.group(1) if match else None


def row(dtk):
    """The table's row for a DTK version (or text naming one), or None when the table does not list it."""
    version = dtk_version(dtk)
    for entry in ROWS:
        if entry["dtk"] == version:
            return entry
    return None


def describe(entry):
    """'DTK-26.04: driver >=6.3.30-V1.4.1a (shipped with rock-6.3.30-V1.4.1a.run)'."""
    return "DTK-{}: driver {} (shipped with {})".format(entry["dtk"], entry["requirement"], entry["shipped"])


def _line(version):
    major_minor = rock_version.major_minor(version)
    return "{}.{}".format(*major_minor) if major_minor else None


def _aio_build(driver):
    """The build of a 6.2 driver: its own, else the build its base's published aio installer carries."""
    return driver["build"] or AIO_BUILDS.get(driver["base"])


def _at_least(driver, bound):
    """True / False / None (unknown) for driver >= bound."""
    if bound.startswith("aio:"):
        line = rock_version.major_minor(driver)
        if line != (6, 2):
            return line > (6, 2)
        build = _aio_build(driver)
        if build is None:
            return None
        return rock_version.compare("6.2.0-V" + build, "6.2.0-V" + bound[4:]) >= 0
    return rock_version.compare(driver, bound) >= 0


def _at_most(driver, bound):
    if bound.startswith("aio:"):
        line = rock_version.major_minor(driver)
        if line != (6, 2):
            return line < (6, 2)
        build = _aio_build(driver)
        if build is None:
            return None
        return rock_version.compare("6.2.0-V" + build, "6.2.0-V" + bound[4:]) <= 0
    return rock_version.compare(driver, bound) <= 0


def _in_range(driver, allowed):
    if "exact" in allowed:
        return rock_version.compare(driver, allowed["exact"]) == 0
    if "line" in allowed and _line(driver) != allowed["line"]:
        return False
    answers = []
    if "min" in allowed:
        answers.append(_at_least(driver, allowed["min"]))
    if "max" in allowed:
        answers.append(_at_most(driver, allowed["max"]))
    if False in answers:
        return False
    return None if None in answers else True


def supports(entry, driver_version):
    """True when the row allows the driver, False when it provably does not, None when it cannot tell."""
    driver = rock_version.parse(driver_version)
    if driver is None:
        return None
    answers = [_in_range(driver, allowed) for allowed in entry["ranges"]]
    if True in answers:
        return True
    return None if None in answers else False


def dtks_for(driver_version):
    """The DTK versions whose rows allow this driver, newest first."""
    return [entry["dtk"] for entry in ROWS if supports(entry, driver_version)]
