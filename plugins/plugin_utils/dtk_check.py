# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Whether an image's DTK and the host's DTK go with the host's rock driver, by Hygon's DTK <-> driver table
(plugins/module_utils/dtk_driver.py holds the table, its source and how its requirements are read)."""

from ansible_collections.dcu.serving.plugins.module_utils import dtk_driver


def _other_dtks(driver):
    dtks = dtk_driver.dtks_for(driver)
    return "DTK " + ", ".join(dtks) if dtks else "none in the table"


def _mismatch(what, version, entry, driver):
    return ("{}: the DTK <-> driver table's row {} does not allow the host's driver {}. Fix: install a driver "
            "that row allows (DTK {} shipped with {}) with playbooks/drivers.yml, or use a DTK this driver "
            "supports ({}).".format(
                what, dtk_driver.describe(entry), driver, version, entry["shipped"], _other_dtks(driver)))


def dtk_driver_check(image_dtk, host_driver_version, host_dtk_version=None, image="", strict=False, runtime=None):
    """'' when the image's DTK (and the host's own DTK, when given) go with the host's driver; else why, and the fix.

    image_dtk: the DTK the image carries: a version (26.04), or text naming it (the image reference
    ...vllm:0.11.0-ubuntu22.04-dtk26.04-py3.10, or its label); host_driver_version: dcu_facts' driver version
    (6.3.30-V1.4.1a, 6.2.35, ...); host_dtk_version: dcu_facts' DTK version; image: the image's name for the
    message (default: image_dtk); runtime: the service's runtime - `host` mounts the host's DTK over the
    image's, so the image must have been built on the same DTK. Only a provable mismatch is refused; with
    strict, a DTK the table does not list, an unknown driver or an undecidable compare is refused too.
    """
    image = image or str(image_dtk or "")
    problems = []
    unknown = []
    if runtime == "host":
        built, mounted = dtk_driver.dtk_version(image_dtk), dtk_driver.dtk_version(host_dtk_version)
        if not mounted:
            problems.append("image {}: runtime host mounts the host's DTK, but the host has none (dcu_facts' "
                            "dtk.version is empty). Fix: set the service's runtime to image (the default: the image's "
                            "own DTK with the host's hyhal, Hygon's recipe), or install the DTK with "
                            "playbooks/drivers.yml.".format(image))
        elif built and built != mounted:
            problems.append("image {image} was built on DTK {built}, but runtime host mounts the host's DTK "
                            "{mounted} over it. Fix: set the service's runtime to image (the default: the image's own "
                            "DTK with the host's hyhal, Hygon's recipe), or use an image built on DTK {mounted}."
                            .format(
                                image=image, built=built, mounted=mounted))
    driver = str(host_driver_version).strip() if host_driver_version else ""
    checks = [("image {} (DTK {})".format(image, dtk_driver.dtk_version(image_dtk) or "?"), image_dtk, True)]
    if host_dtk_version and dtk_driver.dtk_version(host_dtk_version) != dtk_driver.dtk_version(image_dtk):
        checks.append(("the host's DTK {}".format(dtk_driver.dtk_version(host_dtk_version) or host_dtk_version),
                       host_dtk_version, False))
    for what, dtk, is_image in checks:
        version = dtk_driver.dtk_version(dtk)
        entry = dtk_driver.row(version)
        if entry is None:
            if is_image or version:
                unknown.append("{}: {} ({}; {})".format(
                    what, "DTK {} is not in the DTK <-> driver table".format(version) if version
                    else "no DTK version found in it, so the DTK <-> driver table cannot be applied",
                    dtk_driver.SNAPSHOT, dtk_driver.SOURCE))
            continue
        if not driver:
            unknown.append("{}: the host's driver version is unknown (is the driver loaded? dcu_facts' "
                           "driver.version is empty)".format(what))
            continue
        answer = dtk_driver.supports(entry, driver)
        if answer is False:
            problems.append(_mismatch(what, version, entry, driver))
        elif answer is None:
            unknown.append("{}: row {} cannot be decided for the driver {} (a 6.2 driver without its build; "
                           "read the build with `hy-smi --showdriverversion`)".format(
                               what, dtk_driver.describe(entry), driver))
    if strict and unknown:
        problems += [text + ". Fix: check it against Hygon's current table by hand, then run without the "
                     "strict check." for text in unknown]
    return " ".join(problems)


def dtk_driver_row(dtk):
    """The table's row for a DTK version or image reference ({} when the table does not list it):
    dtk, shipped, requirement (verbatim), hardware, ranges (this collection's reading), source, snapshot."""
    entry = dtk_driver.row(dtk)
    if entry is None:
        return {}
    return dict(entry, source=dtk_driver.SOURCE, snapshot=dtk_driver.SNAPSHOT)
