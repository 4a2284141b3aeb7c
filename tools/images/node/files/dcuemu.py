"""The emulated node's kernel and udev, shared by its boot (dcu-emu-boot) and its modprobe.

Only the node image uses this; roles and modules read sysfs and /dev as on a real host. docs/emulation.md.
"""

import fnmatch
import grp
import json
import os
import re
import stat
from pathlib import Path

PROFILE_FILE = Path("/run/dcu-emu/profile.json")
RULE_DIRS = ("/lib/udev/rules.d", "/run/udev/rules.d", "/etc/udev/rules.d")
_TOKEN = re.compile(r'\s*([A-Za-z_]+)(\{[^}]*\})?\s*(==|!=|\+=|:=|=)\s*"([^"]*)"\s*,?')


def settings():
    values = {}
    for line in Path("/etc/dcu-emu.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


def sysfs_root():
    return Path(settings().get("DCU_EMU_SYSFS", "/run/dcu-emu/sys"))


def profile():
    return json.loads(PROFILE_FILE.read_text())


def rules():
    """Every udev rule that sets GROUP or MODE, in udev's order (file name; /etc overrides /lib)."""
    files = {}
    for directory in RULE_DIRS:
        for path in Path(directory).glob("*.rules") if Path(directory).is_dir() else []:
            files[path.name] = path
    for name in sorted(files):
        for line in files[name].read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            tokens = [(m.group(1) + (m.group(2) or ""), m.group(3), m.group(4)) for m in _TOKEN.finditer(line)]
            if any(key in ("GROUP", "MODE") and op in ("=", ":=") for key, op, _ in tokens):
                yield tokens


def _matches(pattern, value):
    return any(fnmatch.fnmatchcase(value or "", alternative) for alternative in pattern.split("|"))


def apply_rules(node, subsystem, driver=None, vendor=None):
    """What udev does to a new device node: the last matching GROUP and MODE win; without a MODE a node
    with a group is 0660, without either root:root 0600. Match keys this emulation does not know
    (ENV{...}, TAG, ...) make a rule not match."""
    group, mode, mode_set = "root", 0o600, False
    facts = {"KERNEL": os.path.basename(node), "SUBSYSTEM": subsystem, "ACTION": "add", "DRIVERS": driver,
             "ATTRS{vendor}": vendor, "DEVPATH": "/devices/" + os.path.basename(node)}
    for tokens in rules():
        matched = True
        for key, op, value in tokens:
            if op in ("==", "!=") and (_matches(value, facts[key]) if key in facts else False) != (op == "=="):
                matched = False
                break
        if not matched:
            continue
        for key, op, value in tokens:
            if key == "GROUP" and op in ("=", ":="):
                group = value
            elif key == "MODE" and op in ("=", ":="):
                mode, mode_set = int(value, 8), True
    if group != "root" and not mode_set:
        mode = 0o660
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:  # udev leaves the node to root when the rule's group does not exist
        gid = 0
    os.chown(node, 0, gid)
    os.chmod(node, mode)


def make_node(path, subsystem, driver=None, vendor=None):
    """A character device the container may use (it is /dev/null's 1:3, allowed by Docker by default)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    apply_rules(str(path), subsystem, driver, vendor)
