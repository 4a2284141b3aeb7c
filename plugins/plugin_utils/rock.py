# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What dcu_driver does about the rock driver: is the wanted one installed, does the
loaded module need a reboot. The version strings differ by source (plugins/module_utils/rock_version.py),
so nothing here compares strings: an install record with the installer's SHA-256 says what was installed,
and versions are compared normalised.
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.module_utils import rock_version


def _is_rock(name):
    """rock, or rock-5.7.1 (the aio drivers put the DTK version in the package name); not rocksdb & co."""
    return name == "rock" or (name.startswith("rock-") and name[5:6].isdigit())


def rock_packages(stdout):
    """Installed rock packages from '<status>\\t<name>\\t<version>[\\t<release>]' lines.

    dpkg-query prints 'installed\\trock-5.7.1\\t6.2.35'; rpm 'installed\\trock\\t6.3.27\\t1.2.5' (the query
    puts 'installed' first so that both read alike). Other states (config-files, half-installed) are not
    an installed driver.
    """
    packages = []
    for line in (stdout or "").splitlines():
        fields = line.split("\t")
        if len(fields) < 3 or fields[0].strip() != "installed" or not _is_rock(fields[1].strip()):
            continue
        name, version = fields[1].strip(), fields[2].strip()
        release = fields[3].strip() if len(fields) > 3 and fields[3].strip() else None
        packages.append({
            "name": name,
            "version": version + ("-" + release if release else ""),
            "parsed": rock_version.parse_package(version, release),
        })
    return packages


def rock_install_state(packages, record, artifact):
    """Whether the bundle's driver artifact is installed, and why.

    packages: rock_packages(); record: the role's install record ({} when none): file, sha256, version,
    package; artifact: the bundle's driver entry (file, sha256, version).
    Returns {installed, adopt, reason, installed_version}: adopt means installed by someone else, to be
    recorded now.
    """
    if not isinstance(artifact, dict) or not artifact.get("sha256") or not artifact.get("version"):
        raise AnsibleFilterError("rock_install_state: the artifact needs file, sha256 and version")
    record = record if isinstance(record, dict) else {}
    installed = [(p["name"], p["version"]) for p in packages]
    found = ", ".join("{} {}".format(*p) for p in installed) or "none"
    recorded = record.get("package") or {}
    if record.get("sha256") == artifact["sha256"] and (recorded.get("name"), recorded.get("version")) in installed:
        return {"installed": True, "adopt": False, "installed_version": artifact["version"], "package": recorded,
                "reason": "{} (sha256 {}) was installed by this role: package {} {}".format(
                    artifact["file"], artifact["sha256"][:12], recorded["name"], recorded["version"])}
    matching = [p for p in packages if rock_version.same(p["parsed"], artifact["version"])]
    if matching:
        return {"installed": True, "adopt": True, "installed_version": artifact["version"],
                "package": {"name": matching[0]["name"], "version": matching[0]["version"]},
                "reason": "package {} {} is rock {} (installed without this role's record)".format(
                    matching[0]["name"], matching[0]["version"], artifact["version"])}
    if record.get("sha256") == artifact["sha256"]:
        reason = "the install record names {} but no rock package is installed (removed by hand?)".format(
            artifact["file"])
    else:
        reason = "installed rock packages: {}; wanted rock {}".format(found, artifact["version"])
    return {"installed": False, "adopt": False, "installed_version": None, "package": {}, "reason": reason}


def rock_module(version):
    """The kernel module a rock version ships: hydcu up to 6.2, hycu from 6.3."""
    major_minor = rock_version.major_minor(version)
    if major_minor is None:
        raise AnsibleFilterError("rock_module: {!r} is not a rock driver version".format(version))
    return "hydcu" if major_minor <= (6, 2) else "hycu"


def rock_reboot_reasons(driver, installed_version):
    """Why the loaded module is not the installed driver (an empty list when it is, or when unknown).

    driver: dcu_facts' driver fact {loaded, module, version}. Only a provable difference counts: another
    module name, or versions that contradict each other; a module without a readable version does not.
    """
    if not driver or not driver.get("loaded") or not installed_version:
        return []
    wanted_module = rock_module(installed_version)
    if driver.get("module") and driver["module"] != wanted_module:
        return ["the loaded module is {} {} but rock {} (module {}) is installed".format(
            driver["module"], driver.get("version") or "(version unknown)", installed_version, wanted_module)]
    if rock_version.differs(driver.get("version"), installed_version):
        return ["the loaded {} module is version {} but rock {} is installed".format(
            driver.get("module"), driver.get("version"), installed_version)]
    return []


def rock_package_of(packages, version, before=None):
    """The package an installer of rock `version` left, as {name, version}; {} when none is found.

    The package that appeared or changed since `before` (the packages before the installer ran) is the
    installer's, however it spells its name and version (rock-6.3.27 1.2.5 would be a rock 6.3.27 that
    no version compare recognises); else the one whose version is `version`.
    """
    known = set((p["name"], p["version"]) for p in before or [])
    new = [p for p in packages if (p["name"], p["version"]) not in known]
    if len(new) == 1:
        return {"name": new[0]["name"], "version": new[0]["version"]}
    for package in packages:
        if rock_version.same(package["parsed"], version):
            return {"name": package["name"], "version": package["version"]}
    if len(packages) == 1:
        return {"name": packages[0]["name"], "version": packages[0]["version"]}
    return {}
