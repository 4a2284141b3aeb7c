#!/usr/bin/python
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: dcu_device_access
short_description: Prove that a user can open the DCU device nodes read-write
version_added: 0.1.0
description:
  - As O(user), in a child process that drops privileges (supplementary groups from the group
    database, then group, then user), opens C(/dev/kfd), C(/dev/mkfd) when present and each expected
    render node read-write, and closes them again. This is what a container runtime or a device
    plugin's health check does.
  - Reports per node the owner, group, mode and result. Never changes anything.
  - On failure the message is the diagnosis and the fix. A missing C(/dev/kfd) means the driver is not
    loaded; permission denied names the group the user lacks and the C(usermod) command, or, for a node
    left to group C(root), the udev rule that gives it a device group; fewer render nodes than expected
    cards names the missing ones and the DCUs the driver did not bind.
  - Cards are the vendor C(0x1d94) devices the DCU driver binds (the CPUs' own C(0x1d94) functions are
    not cards), with their render nodes mapped by PCI address.
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
    details: Read-only; opens and closes the nodes, as in normal mode.
  diff_mode:
    support: none
requirements:
  - Root on the managed host (C(become=true)) to test another user than the one the module runs as.
seealso:
  - module: dcu.serving.dcu_facts
    description: The cards, their PCI addresses and render nodes this module checks.
options:
  user:
    description:
      - The user to test, for example the service user the inference units run as.
      - Testing another user than the one the module runs as needs root (C(become=true)).
    type: str
    required: true
  expected_cards:
    description:
      - Number of cards the host must expose. Fewer render nodes fail, naming the missing ones.
      - Defaults to the number of O(render_nodes) when given, else to the number of cards sysfs lists.
    type: int
  render_nodes:
    description:
      - Render nodes to open. Defaults to the render node of every card sysfs lists (mapped by PCI
        address, since C(renderD) numbers are not card indexes).
    type: list
    elements: path
  sysfs_root:
    description: Where sysfs is mounted.
    type: path
    default: /sys
  dev_root:
    description: Where the device nodes live (C(kfd), C(mkfd), C(dri/renderD*)).
    type: path
    default: /dev
"""

EXAMPLES = r"""
- name: The service user can reach every card
  dcu.serving.dcu_device_access:
    user: dcu-serving
    expected_cards: 8
  become: true

- name: Only the cards this instance uses
  dcu.serving.dcu_device_access:
    user: dcu-serving
    render_nodes: [/dev/dri/renderD128]
"""

RETURN = r"""
nodes:
  description: One entry per node checked.
  returned: always
  type: list
  elements: dict
  sample:
    - path: /dev/kfd
      exists: true
      owner: root
      group: video
      mode: "0660"
      result: ok
    - path: /dev/dri/renderD129
      exists: true
      owner: root
      group: video
      mode: "0660"
      result: permission denied
user:
  description: The user tested.
  returned: always
  type: str
groups:
  description: The groups the user's processes get (primary and supplementary, from the group database).
  returned: always
  type: list
  elements: str
problems:
  description: Diagnosis and fix for each problem found; empty when everything opened.
  returned: always
  type: list
  elements: str
"""

import errno
import grp
import json
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils import hysmi


def group_name(gid):
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def describe(path):
    try:
        info = os.stat(path)
    except OSError:
        return {"path": path, "exists": False, "owner": None, "group": None, "mode": None, "gid": None}
    return {
        "path": path,
        "exists": True,
        "owner": user_name(info.st_uid),
        "group": group_name(info.st_gid),
        "gid": info.st_gid,
        "mode": "{:04o}".format(stat.S_IMODE(info.st_mode)),
    }


def open_as(account, gids, paths):
    """Open each path read-write in a child running as `account`; {path: errno or 0}."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into Ansible's code
        status = 1
        try:
            os.close(read_end)
            os.setgroups(gids)
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            results = {}
            for path in paths:
                try:
                    os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))
                    results[path] = 0
                except OSError as exc:
                    results[path] = exc.errno
            os.write(write_end, json.dumps(results).encode())
            status = 0
        except Exception as exc:  # report anything to the parent rather than die silently
            os.write(write_end, json.dumps({"__error__": str(exc)}).encode())
        finally:
            os._exit(status)
    os.close(write_end)
    chunks = []
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks).decode() or "{}")


def result_text(code):
    if code == 0:
        return "ok"
    if code in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if code == errno.ENOENT:
        return "missing"
    return os.strerror(code).lower()


def diagnose(node, account_name, group_names):
    """The diagnosis and the fix for one node that did not open."""
    path, result = node["path"], node["result"]
    if not node["exists"]:
        if not os.path.basename(path).startswith("renderD"):
            return ("{} is missing: the DCU driver is not loaded. Load it with `hy-smi --loaddriver` "
                    "(or reboot after installing the driver) and check `lsmod | grep -E 'hycu|hydcu'`".format(path))
        return "{} is missing: the driver created no such render node; check `ls -l /dev/dri` and the " \
               "driver's load messages (`dmesg | grep -i hy`)".format(path)
    if result == "permission denied":
        group = node["group"]
        if group == "root":
            # Never advise adding a service user to root: the node lacks its device group.
            return "{}: permission denied — the node belongs to group root (mode {}), so no service user " \
                   "may open it. Fix: give it a device group with a udev rule (role dcu.serving.dcu_driver " \
                   "installs /etc/udev/rules.d/70-dcu.rules: GROUP=\"render\" or \"video\", MODE=\"0660\"), " \
                   "then `udevadm control --reload-rules && udevadm trigger`".format(path, node["mode"])
        if group not in group_names:
            return "{path}: permission denied — user {user} is not in group {group} (owner of the node). Fix: " \
                   "`usermod -aG {group} {user}`, then restart the user's services or sessions".format(
                       path=path, user=account_name, group=group)
        return "{}: permission denied although user {} is in group {} — mode {} does not let the group " \
               "read and write; install the udev rule that sets MODE=\"0660\" (role dcu.serving.dcu_driver)".format(
                   path, account_name, group, node["mode"])
    return "{}: {}".format(path, result)


def main():
    module = AnsibleModule(
        argument_spec={
            "user": {"type": "str", "required": True},
            "expected_cards": {"type": "int"},
            "render_nodes": {"type": "list", "elements": "path"},
            "sysfs_root": {"type": "path", "default": "/sys"},
            "dev_root": {"type": "path", "default": "/dev"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        account = pwd.getpwnam(params["user"])
    except KeyError:
        module.fail_json(msg="user {} does not exist on this host; create it (role dcu.serving.dcu_driver, "
                             "dcu_driver_service_users) or name an existing user".format(params["user"]))
    if os.geteuid() != 0 and os.geteuid() != account.pw_uid:
        module.fail_json(msg="testing user {} needs root: run the task with become: true".format(params["user"]))

    problems = []
    dev_root = params["dev_root"]
    functions = hysmi.pci_functions(params["sysfs_root"])
    cards = hysmi.sysfs_cards(functions)
    unbound = [f for f in functions if f["kind"] == "unbound"]
    if params["render_nodes"] is not None:
        render_nodes = list(params["render_nodes"])
    else:
        render_nodes = [os.path.join(dev_root, "dri", card["render"]) for card in cards if card["render"]]
        for card in cards:
            if not card["render"]:
                problems.append("card {} ({}) has no render node: the driver did not create one; check "
                                "`dmesg | grep -i {}`".format(card["index"], card["pci_bus"], card["pci_bus"]))
    kfd, mkfd = os.path.join(dev_root, "kfd"), os.path.join(dev_root, "mkfd")
    paths = [kfd] + ([mkfd] if os.path.exists(mkfd) else []) + render_nodes
    gids = os.getgrouplist(account.pw_name, account.pw_gid)
    group_names = sorted({group_name(gid) for gid in gids})
    opened = open_as(account, gids, paths)
    if "__error__" in opened:
        module.fail_json(msg="could not switch to user {}: {}".format(account.pw_name, opened["__error__"]))

    nodes = []
    for path in paths:
        node = describe(path)
        node["result"] = result_text(opened.get(path, errno.ENOENT))
        nodes.append(node)
        if node["result"] != "ok":
            problems.append(diagnose(node, account.pw_name, group_names))
    present = [node["path"] for node in nodes[len(paths) - len(render_nodes):] if node["exists"]]
    expected = params["expected_cards"]
    if expected is None:
        expected = len(render_nodes) if params["render_nodes"] is not None else len(cards)
    if len(present) < expected:
        problems.append(
            "expected {} cards but only {} render nodes are present ({}); sysfs shows {} card{} bound by the "
            "driver ({}){}".format(
                expected, len(present), ", ".join(present) or "none", len(cards), "" if len(cards) == 1 else "s",
                ", ".join(card["pci_bus"] for card in cards) or "none",
                "; cards without DRM nodes: " + "; ".join(hysmi.describe_function(f) for f in unbound)
                if unbound else ""))
    for node in nodes:
        node.pop("gid")
    result = {"changed": False, "nodes": nodes, "user": account.pw_name, "groups": group_names,
              "problems": problems}
    if problems:
        module.fail_json(msg="user {} cannot use the DCUs: {}".format(account.pw_name, "; ".join(problems)),
                         **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
