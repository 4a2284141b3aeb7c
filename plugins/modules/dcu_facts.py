#!/usr/bin/python
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: dcu_facts
short_description: Gather facts about the Hygon DCU cards, driver, hyhal and DTK of a host
version_added: 0.1.0
description:
  - Returns the DCU cards (index, PCI address, C(/dev/dri/card*) and C(/dev/dri/renderD*) nodes, NUMA
    node, VRAM, series, bound driver), the loaded driver module and its version, the DTK version and the
    hyhal path, as the C(dcu) fact.
  - Which devices are cards is decided by sysfs. Hygon CPUs expose dozens of PCI functions with the DCU
    vendor id C(0x1d94) (root complexes, IOMMU, PSP/crypto, data fabric; BW boxes add switch functions); a
    card is a C(0x1d94) device the DCU driver (C(hycu) or C(hydcu)) binds or that has DRM nodes. Display or
    co-processor devices the driver did not bind are listed in RV(ansible_facts.dcu.unbound).
  - The card index is hy-smi's, matched to sysfs by PCI address (hy-smi's order is not PCI address order).
    hy-smi is asked for named fields (C(--showbus --showproductname --showmeminfo vram --showtoponuma)),
    first as JSON, then as text; without hy-smi the index is the DRM node order, the order hy-smi uses.
    Every source gives the same cards, indexes, PCI addresses, DRM nodes and NUMA nodes.
  - Accepts every hy-smi format seen in the field (docs/field-evidence.md) - HCU and DCU labels, C(card0)-
    or C(card1)-based JSON, log lines before the JSON and JSON with missing commas, PCI addresses with
    C(--> SN:) and C(--> OAM ID:) suffixes, MiB or byte sizes, topology lines without a colon.
  - Reads in the same call the other small things a role decides by (O(stat), O(read), O(commands),
    O(getent), as M(dcu.serving.host_probe) does), so a role that needs a dozen such reads pays one round trip
    to the host instead of one each.
  - Read-only.
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
  - dcu.serving.attributes.facts
  - dcu.serving.host_probe
attributes:
  check_mode:
    support: full
    details: Read-only.
  diff_mode:
    support: none
  facts:
    support: full
requirements:
  - C(hy-smi) from hyhal for the cards' indexes, product names and VRAM; without it the cards come from sysfs.
seealso:
  - module: dcu.serving.dcu_device_access
    description: Proves that a user can open the device nodes these facts list.
options:
  sysfs_root:
    description: Where sysfs is mounted.
    type: path
    default: /sys
  hy_smi_path:
    description:
      - Path of C(hy-smi). When left at the default and absent, C(/usr/local/hyhal/bin/hy-smi) is tried too.
      - When neither exists the cards come from sysfs.
    type: path
    default: /opt/hyhal/bin/hy-smi
  dtk_path:
    description: Path of the active DTK (its C(.info/rocm_version) gives the version).
    type: path
    default: /opt/dtk
  source:
    description:
      - Where the card list comes from. V(auto) takes the first that answers of hy-smi JSON, hy-smi text
        and sysfs. The others force one source and fail when it does not answer (to compare them).
    type: str
    choices: [auto, hy-smi-json, hy-smi-text, sysfs]
    default: auto
  timeout:
    description: Seconds one hy-smi call may take (it waits for its daemon, hymgr).
    type: int
    default: 30
"""

EXAMPLES = r"""
- name: Read the DCU cards
  dcu.serving.dcu_facts:

- name: Show each card's render node and NUMA node
  ansible.builtin.debug:
    msg: "card {{ item.index }}: {{ item.render_node }}, NUMA node {{ item.numa_node }}"
  loop: "{{ ansible_facts.dcu.cards }}"

- name: Fail when a card is missing
  ansible.builtin.assert:
    that: ansible_facts.dcu.card_count == 8
    fail_msg: "{{ ansible_facts.dcu.card_count }} of 8 DCU cards visible"
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: dict
  contains:
    dcu:
      description: The DCU stack of the host.
      returned: always
      type: dict
      contains:
        cards:
          description: One entry per card, sorted by index (hy-smi's index).
          type: list
          elements: dict
          sample:
            - index: 0
              pci_bus: "0000:05:00.0"
              device_id: "0x6370"
              series: BW100
              numa_node: 0
              vram_total_mib: 65520
              driver: hycu
              card_node: /dev/dri/card0
              render_node: /dev/dri/renderD128
        card_count:
          description: Number of cards.
          type: int
          sample: 8
        source:
          description: Where the card list came from, V(hy-smi-json), V(hy-smi-text) or V(sysfs).
          type: str
        unbound:
          description: DCU cards (display or co-processor class, or a known DCU device id) without DRM nodes,
            whether no driver binds them (not loaded yet) or the driver bound them and could not bring them
            up (a driver/vbios mismatch), each with C(pci_bus), C(device_id), C(series), C(driver) and a
            one-line C(summary).
          type: list
          elements: dict
        driver_functions:
          description: Number of vendor C(0x1d94) functions the DCU driver binds that are not cards (no card
            id or class, no DRM nodes), such as a BW box's switch endpoints. Not cards, not a fault.
          type: int
        platform_functions:
          description: Number of other vendor C(0x1d94) PCI functions (CPU and switch functions, not cards).
          type: int
        driver:
          description: The loaded kernel module (V(hycu) or V(hydcu)) and its version as the host prints it
            (sysfs, else hy-smi); both null when none is loaded.
          type: dict
          sample: {"loaded": true, "module": "hycu", "version": "6.3.30-V1.4.1a"}
        device_nodes:
          description: The device nodes that exist of C(/dev/kfd), C(/dev/mkfd) and each card's card and render
            node, by path, with the owning group's id and name (V(UNKNOWN) for a gid without a name, as stat(1)
            prints it). A node that is not listed is missing.
          type: dict
          sample: {"/dev/kfd": {"gid": 992, "group": "render"}, "/dev/dri/renderD128": {"gid": 992, "group": "render"}}
        numa_cpus:
          description: The CPU list of each NUMA node a card sits on (sysfs C(devices/system/node/node<N>/cpulist)),
            by node number; nodes without the file are left out.
          type: dict
          sample: {"0": "0-31", "1": "32-63"}
        hyhal:
          description: The hyhal directory and hy-smi path found (null when absent).
          type: dict
          sample: {"path": "/opt/hyhal", "hy_smi": "/opt/hyhal/bin/hy-smi"}
        dtk:
          description: The active DTK path and version (null when absent).
          type: dict
          sample: {"path": "/opt/dtk", "version": "26.04"}
        errors:
          description: Why a preferred source was skipped (hy-smi missing, failing or unparsable, with the
            fix when known) and where hy-smi and sysfs disagree.
          type: list
          elements: str
    dcu_host:
      description:
        - With O(host_facts), systemd's and the container engine's versions, parsed - as
          M(dcu.serving.host_probe) returns them.
      returned: with O(host_facts)
      type: dict
probe:
  description: What O(stat), O(read) and O(commands) asked for.
  returned: always
  type: dict
  contains:
    stat:
      description: By path, C(exists), C(isdir), C(islnk), C(lnk_target) (a link's target, else null),
        C(gr_name) (the owning group's name, else null).
      type: dict
      sample: {"/dev/kfd": {"exists": true, "isdir": false, "islnk": false, "lnk_target": null, "gr_name": "render"}}
    read:
      description: By path, the file's text, or null.
      type: dict
      sample: {"/var/lib/dcu-serving/rock-install.json": "{\"sha256\": \"71608c09...\"}\n"}
    commands:
      description: By name, C(rc), C(stdout) and C(stderr).
      type: dict
      sample: {"systemd": {"rc": 0, "stdout": "systemd 252 (252.36-1~deb12u1)\n", "stderr": ""}}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils import host_probe, hysmi

DEFAULT_HY_SMI = "/opt/hyhal/bin/hy-smi"
ALTERNATE_HY_SMI = "/usr/local/hyhal/bin/hy-smi"
SOURCES = ("hy-smi-json", "hy-smi-text", "sysfs")


def find_hy_smi(path):
    candidates = [path] + ([ALTERNATE_HY_SMI] if path == DEFAULT_HY_SMI else [])
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


class HySmi(object):
    """hy-smi with a deadline per call (it blocks while hymgr is not answering)."""

    def __init__(self, module, path, timeout):
        self.module, self.path, self.timeout = module, path, timeout

    def run(self, args):
        command = [self.path, *args]
        if os.path.exists("/usr/bin/timeout"):
            command = ["/usr/bin/timeout", str(self.timeout), *command]
        rc, out, err = self.module.run_command(command)
        if rc == 124 and command[0] == "/usr/bin/timeout":
            err = "no answer within {}s".format(self.timeout)
        return rc, out, err


def failure(what, rc, out, err):
    text = ((err or "") + "\n" + (out or "")).strip()
    hint = hysmi.explain_failure(text)
    return "{} exited {}: {}{}".format(what, rc, text[-300:], " ({})".format(hint) if hint else "")


def smi_rows(smi, source, errors):
    """hy-smi's cards from one source, or None (with the reason in errors)."""
    flags = hysmi.FIELD_FLAGS + (["--json"] if source == "hy-smi-json" else [])
    what = "hy-smi " + " ".join(flags)
    rc, out, err = smi.run(flags)
    if rc != 0:
        errors.append(failure(what, rc, out, err))
        return None
    try:
        fields = hysmi.parse_fields_json(out) if source == "hy-smi-json" else hysmi.parse_fields_text(out)
    except hysmi.HySmiParseError as exc:
        errors.append("{}: {}".format(what, exc))
        return None
    rows = hysmi.smi_cards(fields)
    if not any(row["pci_bus"] for row in rows):
        errors.append("{}: no PCI addresses in the output, so its cards cannot be matched to sysfs".format(what))
        return None
    return rows


def read_cards(smi, functions, wanted, errors):
    """(source, cards) from the wanted source, or from the first that answers when wanted is auto."""
    order = SOURCES if wanted == "auto" else (wanted,)
    for source in order:
        if source == "sysfs":
            cards, _problems = hysmi.merge(functions)
            return source, cards
        if smi is None:
            continue
        rows = smi_rows(smi, source, errors)
        if rows is not None:
            cards, problems = hysmi.merge(functions, rows)
            errors.extend(problems)
            return source, cards
    return None, []


def read_text(path):
    try:
        with open(path) as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def numa_cpus(sysfs_root, cards):
    nodes = sorted({card["numa_node"] for card in cards if card.get("numa_node") is not None})
    found = {}
    for node in nodes:
        cpus = read_text(os.path.join(sysfs_root, "devices", "system", "node", "node%d" % node, "cpulist"))
        if cpus:
            found[str(node)] = cpus
    return found


def device_nodes(cards):
    paths = ["/dev/kfd", "/dev/mkfd"]
    paths += [card[key] for card in cards for key in ("card_node", "render_node") if card.get(key)]
    nodes = {}
    for path in paths:
        try:
            gid = os.stat(path).st_gid
        except OSError:
            continue
        nodes[path] = {"gid": gid, "group": host_probe.group_name(gid) or "UNKNOWN"}
    return nodes


def main():
    module = AnsibleModule(
        argument_spec={
            "sysfs_root": {"type": "path", "default": "/sys"},
            "hy_smi_path": {"type": "path", "default": DEFAULT_HY_SMI},
            "dtk_path": {"type": "path", "default": "/opt/dtk"},
            "source": {"type": "str", "default": "auto", "choices": ["auto", *list(SOURCES)]},
            "timeout": {"type": "int", "default": 30},
            **host_probe.ARGUMENT_SPEC,
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["timeout"] < 1:
        module.fail_json(msg="timeout must be at least 1 second, got {}".format(params["timeout"]))
    errors = []
    hy_smi = find_hy_smi(params["hy_smi_path"])
    smi = HySmi(module, hy_smi, params["timeout"]) if hy_smi else None
    if not hy_smi:
        errors.append("hy-smi not found at {}".format(params["hy_smi_path"]))
    functions = hysmi.pci_functions(params["sysfs_root"])
    source, cards = read_cards(smi, functions, params["source"], errors)
    if source is None:
        module.fail_json(msg="source {} did not answer: {}".format(params["source"], "; ".join(errors)),
                         errors=errors)

    driver_module, driver_version = hysmi.loaded_driver(params["sysfs_root"])
    if driver_module and not driver_version and smi:
        # The module's version file is missing on some drivers: hy-smi knows.
        rc, out, _err = smi.run(["--showdriverversion"])
        driver_version = hysmi.parse_driver_version(out) if rc == 0 else None

    dtk_version = read_text(os.path.join(params["dtk_path"], ".info", "rocm_version"))
    unbound = [{"pci_bus": f["pci_bus"], "device_id": f["device_id"], "class": f["class"], "driver": f["driver"],
                "series": hysmi.SERIES_BY_DEVICE.get(f["device_id"]), "summary": hysmi.describe_function(f)}
               for f in functions if f["kind"] == "unbound"]
    facts = {
        "cards": cards,
        "card_count": len(cards),
        "source": source,
        "unbound": unbound,
        "driver_functions": sum(1 for f in functions if f["kind"] == "driver_function"),
        "platform_functions": sum(1 for f in functions if f["kind"] == "platform"),
        "device_nodes": device_nodes(cards),
        "numa_cpus": numa_cpus(params["sysfs_root"], cards),
        "driver": {"loaded": driver_module is not None, "module": driver_module, "version": driver_version},
        "hyhal": {
            "path": os.path.dirname(os.path.dirname(hy_smi)) if hy_smi else None,
            "hy_smi": hy_smi,
        },
        "dtk": {
            "path": params["dtk_path"] if dtk_version else None,
            "version": dtk_version,
        },
        "errors": errors,
    }
    probe, getent_facts = host_probe.probe(module)
    module.exit_json(changed=False, ansible_facts=dict(getent_facts, dcu=facts), probe=probe)


if __name__ == "__main__":
    main()
