#!/usr/bin/python
# Copyright: dcu-serving contributors
# Apache License 2.0 (see the collection's LICENSE)

DOCUMENTATION = r"""
---
module: dcu_facts
short_description: Gather facts about the Hygon DCU cards, driver, hyhal and DTK of a host
version_added: 0.1.0
description:
  - Returns the DCU cards (index, PCI address, C(/dev/dri/card*) and C(/dev/dri/renderD*) nodes, NUMA
    node, VRAM, series), the loaded driver module and its version, the DTK version and the hyhal path,
    as the C(dcu) fact.
  - Cards come from the first source that answers, in order C(hy-smi --json), the C(hy-smi) table, sysfs
    (PCI vendor C(0x1d94)). DRM nodes always come from sysfs, mapped by PCI address, because C(cardN)
    is not the card index (C(card0) is usually the onboard VGA).
  - Accepts every hy-smi format seen in the field, HCU and DCU key names, C(card0)- or C(card1)-based
    JSON, banner lines mixed with the JSON, a PCI bus carrying a C(--> SN:) suffix, MiB or byte sizes.
  - Read-only.
author:
  - dcu-serving contributors
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
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
          description: One entry per card, sorted by index.
          type: list
          elements: dict
          sample:
            - index: 0
              pci_bus: "0000:04:00.0"
              series: K100_AI
              numa_node: 0
              vram_total_mib: 65520
              card_node: /dev/dri/card1
              render_node: /dev/dri/renderD128
        card_count:
          description: Number of cards.
          type: int
          sample: 8
        source:
          description: Where the card list came from, V(hy-smi --json), V(hy-smi) (the table) or V(sysfs).
          type: str
        driver:
          description: The loaded kernel module (V(hycu) or V(hydcu)) and its version; both null when none is loaded.
          type: dict
          sample: {"loaded": true, "module": "hycu", "version": "6.3.30-V1.4.1a"}
        hyhal:
          description: The hyhal directory and hy-smi path found (null when absent).
          type: dict
          sample: {"path": "/opt/hyhal", "hy_smi": "/opt/hyhal/bin/hy-smi"}
        dtk:
          description: The active DTK path and version (null when absent).
          type: dict
          sample: {"path": "/opt/dtk", "version": "26.04"}
        errors:
          description: Why a preferred source was skipped (hy-smi missing, failing or unparsable).
          type: list
          elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils import hysmi

DEFAULT_HY_SMI = "/opt/hyhal/bin/hy-smi"
ALTERNATE_HY_SMI = "/usr/local/hyhal/bin/hy-smi"


def find_hy_smi(path):
    candidates = [path] + ([ALTERNATE_HY_SMI] if path == DEFAULT_HY_SMI else [])
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def read_cards(module, hy_smi, sysfs_cards, errors):
    """Cards from the first source that answers: hy-smi --json, the hy-smi table, sysfs."""
    if hy_smi:
        rc, out, err = module.run_command([hy_smi, "--json"])
        if rc == 0:
            try:
                return "hy-smi --json", hysmi.merge_cards(sysfs_cards, smi_cards=hysmi.parse_json(out))
            except hysmi.HySmiParseError as exc:
                errors.append("hy-smi --json: {}".format(exc))
        else:
            errors.append("hy-smi --json exited {}: {}".format(rc, (err or out).strip()[-300:]))
        rc, out, err = module.run_command([hy_smi])
        if rc == 0:
            try:
                _label, rows = hysmi.parse_table(out)
                return "hy-smi", hysmi.merge_cards(sysfs_cards, table_rows=rows)
            except hysmi.HySmiParseError as exc:
                errors.append("hy-smi: {}".format(exc))
        else:
            errors.append("hy-smi exited {}: {}".format(rc, (err or out).strip()[-300:]))
    return "sysfs", hysmi.merge_cards(sysfs_cards)


def read_text(path):
    try:
        with open(path) as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def main():
    module = AnsibleModule(
        argument_spec={
            "sysfs_root": {"type": "path", "default": "/sys"},
            "hy_smi_path": {"type": "path", "default": DEFAULT_HY_SMI},
            "dtk_path": {"type": "path", "default": "/opt/dtk"},
        },
        supports_check_mode=True,
    )
    params = module.params
    errors = []
    hy_smi = find_hy_smi(params["hy_smi_path"])
    if not hy_smi:
        errors.append("hy-smi not found at {}".format(params["hy_smi_path"]))
    sysfs_cards = hysmi.discover_sysfs(params["sysfs_root"])
    source, cards = read_cards(module, hy_smi, sysfs_cards, errors)

    driver_module, driver_version = hysmi.loaded_driver(params["sysfs_root"])
    if driver_module and not driver_version and hy_smi:
        rc, out, _err = module.run_command([hy_smi, "--showdriverversion"])
        driver_version = hysmi.parse_driver_version(out) if rc == 0 else None

    dtk_version = read_text(os.path.join(params["dtk_path"], ".info", "rocm_version"))
    facts = {
        "cards": cards,
        "card_count": len(cards),
        "source": source,
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
    module.exit_json(changed=False, ansible_facts={"dcu": facts})


if __name__ == "__main__":
    main()
