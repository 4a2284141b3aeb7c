# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Compare rock (Hygon DCU driver) versions whatever source printed them.

One driver shows up under several spellings (docs/field-evidence.md):
  installer file   rock-6.3.27-V1.2.5.run, rock-5.7.1-6.2.26-V1.5.aio.run (DTK 5.7.1 bundle, driver 6.2.26)
  rpm package      rock-6.3.27-1.2.5 (NAME rock, VERSION 6.3.27, RELEASE 1.2.5); older: NAME rock-5.7.1,
                   VERSION 6.2.18, RELEASE 1
  hy-smi           6.2.28, 6.2.17a, 6.3.27-V1.2.5, 6.3.31-V1.5.3.beta
  sysfs            /sys/module/hydcu/version: 6.2.35; for hycu (6.3) no public sample; or no file at all
An exact string compare reinstalls the driver on every run or keeps a reboot "pending" forever. Here a
version is its driver base (major.minor.patch plus an optional letter, e.g. 6.2.17a) and, when the
source carries one, its build (the V-tag: 1.2.5). Two versions are the same when their bases are equal
and their builds do not contradict each other; one that lacks a build is compatible with any build.
"""

import re

# major.minor.patch with an optional letter, then an optional build: -V1.2.5 (installer, hy-smi, sysfs)
_WITH_TAG = re.compile(r"(?<![\d.])(\d+)\.(\d+)\.(\d+)([a-z]?)[-_.]?[Vv]"
                       r"(\d+(?:\.\d+)*[a-z]?(?:\.(?:beta|alpha|rc)\d*)?)(?!\d)(?!\.\d)")
_PLAIN = re.compile(r"(?<![\d.])(\d+)\.(\d+)\.(\d+)([a-z]?)(?!\d)(?!\.\d)")
# An rpm/deb release that is the build without its V (rock-6.3.27-1.2.5): at least two dotted parts.
# A single number (6.2.18-1) is a package release, which says nothing about the build.
_RELEASE_BUILD = re.compile(r"^(\d+(?:\.\d+)+[a-z]?)$")


def parse(text):
    """The driver version in `text`, as {'base': '6.3.27', 'build': '1.2.5' or None}; None when absent.

    When the text holds several versions (rock-5.7.1-6.2.26-V1.5.aio.run names the DTK it came with
    first), the one with a V-tag is the driver's; without any V-tag, the last one is.
    """
    if not text:
        return None
    text = str(text)
    tagged = list(_WITH_TAG.finditer(text))
    if tagged:
        match = tagged[-1]
        return _version(match, match.group(5))
    plain = list(_PLAIN.finditer(text))
    if not plain:
        return None
    return _version(plain[-1], None)


def parse_package(version, release=None):
    """A package's VERSION and RELEASE (rpm) or its whole Version (deb, "6.3.27-1.2.5") as a version."""
    if release is None and version and "-" in str(version):
        version, release = str(version).split("-", 1)
    parsed = parse(version)
    if parsed is None:
        return None
    release = (release or "").strip()
    if parsed["build"] is None and _RELEASE_BUILD.match(release.lstrip("Vv")):
        parsed["build"] = release.lstrip("Vv").lower()
    return parsed


def _version(match, build):
    base = "{}.{}.{}{}".format(int(match.group(1)), int(match.group(2)), int(match.group(3)),
                               match.group(4).lower())
    return {"base": base, "build": build.lower() if build else None}


def same(a, b):
    """True when versions a and b (parsed or text) can be the same driver; False when they differ provably."""
    a, b = _parsed(a), _parsed(b)
    if a is None or b is None:
        return None
    if a["base"] != b["base"]:
        return False
    return a["build"] is None or b["build"] is None or a["build"] == b["build"]


def differs(a, b):
    """True only when both versions are known and provably not the same driver."""
    result = same(a, b)
    return result is False


def text(version):
    """'6.3.27-V1.2.5' for a parsed version (the spelling of the installer and hy-smi)."""
    version = _parsed(version)
    if version is None:
        return None
    return version["base"] + ("-V" + version["build"] if version["build"] else "")


def major_minor(version):
    """(6, 3) for 6.3.27-V1.2.5, or None."""
    version = _parsed(version)
    if version is None:
        return None
    major, minor = version["base"].split(".")[:2]
    return int(major), int(minor)


def _parsed(version):
    return version if isinstance(version, dict) or version is None else parse(version)


# A build's parts: 1.4.1a -> (1, ''), (4, ''), (1, 'a'); 1.5.3.beta -> ..., then a pre-release marker.
_BUILD_PART = re.compile(r"^(\d+)([a-z]*)$")
_PRE_RELEASE = ("alpha", "beta", "rc")


def _base_key(base):
    """'6.2.17a' -> (6, 2, 17, 'a'): the letter orders after the bare number (6.2.17 < 6.2.17a < 6.2.18)."""
    match = re.match(r"^(\d+)\.(\d+)\.(\d+)([a-z]?)$", base)
    return int(match.group(1)), int(match.group(2)), int(match.group(3)), match.group(4)


def _build_key(build):
    """'1.4.1a' -> (((1, ''), (4, ''), (1, 'a')), 1); a pre-release (1.5.3.beta) orders before its release.

    Each numeric part compares as a number (V01.9.2 is 1.9.2), its letter after the bare number; trailing
    zero parts do not count (1.5 == 1.5.0 < 1.5.0a). The second element is 0 for alpha/beta/rc, 1 for a release.
    """
    parts = build.split(".")
    release = 1
    if parts and parts[-1].rstrip("0123456789") in _PRE_RELEASE:
        parts, release = parts[:-1], 0
    key = []
    for part in parts:
        match = _BUILD_PART.match(part)
        key.append((int(match.group(1)), match.group(2)) if match else (0, part))
    while key and key[-1] == (0, ""):
        key.pop()
    return tuple(key), release


def compare(a, b):
    """Order two driver versions (parsed or text): -1 when a is older, 0 when they can be the same, 1 when newer.

    The driver base decides first (major, minor, patch as numbers, then the letter: 6.2.17 < 6.2.17a < 6.2.18);
    equal bases are ordered by their builds (1.1.0a < 1.1.2 < 1.5 < 1.5.3.beta < 1.5.3) when both carry one.
    A version without a build compares equal to any build of its base, as same() says: hy-smi's 6.3.30 may
    be 6.3.30-V1.4.1a. None when either is not a driver version.

    Builds are only compared within one base: Hygon restarted the V-numbering with the 6.3.16 driver
    (6.3.6-V1.9.0c, then 6.3.16-V1.1.0a), so a build says nothing across bases.
    """
    a, b = _parsed(a), _parsed(b)
    if a is None or b is None:
        return None
    key_a, key_b = _base_key(a["base"]), _base_key(b["base"])
    if key_a == key_b:
        if a["build"] is None or b["build"] is None:
            return 0
        key_a, key_b = _build_key(a["build"]), _build_key(b["build"])
    return (key_a > key_b) - (key_a < key_b)
