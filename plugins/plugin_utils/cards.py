# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""dcu_facts' view of the cards: whether a host's cards match the inventory, said so that an
operator can act on it (every card with its PCI address, bound driver and DRM nodes, and the fix)."""


def _card_line(card):
    nodes = [node.rsplit("/", 1)[-1] for node in (card.get("card_node"), card.get("render_node")) if node]
    return "card {} at {} ({}): driver {}, {}".format(
        card.get("index"), card.get("pci_bus"), card.get("series") or card.get("device_id") or "unknown",
        card.get("driver") or "none", "DRM " + "+".join(nodes) if nodes else "no DRM nodes")


def dcu_card_problem(facts, expected=0, wanted=None, variable="the inventory"):
    """'' when the host shows the cards the inventory expects; else the problem, card by card, and the fix.

    facts: ansible_facts.dcu; expected: the card count the host must show (0: any, but at least one);
    wanted: card indexes the inventory names (e.g. dcu_vllm_cards); variable: the setting to name.
    """
    facts = facts or {}
    cards = facts.get("cards") or []
    unbound = facts.get("unbound") or []
    expected = int(expected or 0)
    missing = sorted(set(int(i) for i in (wanted or [])) - set(card["index"] for card in cards))
    if cards and (expected == 0 or len(cards) == expected) and not missing:
        return ""
    if missing:
        problem = "{} names card {} but the host has cards {}".format(
            variable, ", ".join(str(i) for i in missing), ", ".join(str(c["index"]) for c in cards) or "none")
    elif not cards:
        problem = "the host shows no DCU card"
    else:
        problem = "the host shows {} DCU card{}, {} expects {}".format(
            len(cards), "" if len(cards) == 1 else "s", variable, expected)
    lines = [_card_line(card) for card in cards]
    lines += ["not up: " + device.get("summary", device.get("pci_bus", "?")) for device in unbound]
    if unbound:
        fix = ("a DCU without DRM nodes is not usable: with driver none, the driver is not loaded (lsmod | grep -E "
               "'hycu|hydcu'; hy-smi --loaddriver); with the driver bound, it could not bring the card up, which a "
               "driver/vbios mismatch does (dcu_driver_update_vbios, then a reboot); read dmesg | grep -iE "
               "'hycu|hydcu'; a card that stays down is faulty")
    elif not cards:
        fix = ("install and load the driver first (ansible-playbook dcu.serving.drivers -i <inventory>), "
               "then check /opt/hyhal/bin/hy-smi")
    else:
        fix = "if the host really has {} cards, set {} to match; otherwise look for the missing card in " \
              "`lspci -d 1d94:` and the BMC".format(len(cards), variable)
    ignored = facts.get("platform_functions") or 0
    source = facts.get("source") or "unknown"
    return "{} (cards read from {}{}). {}. Fix: {}.{}".format(
        problem, source, "; " + "; ".join(facts.get("errors") or []) if facts.get("errors") else "",
        "; ".join(lines) if lines else "no DCU device on the PCI bus", fix,
        " ({} other vendor 0x1d94 PCI functions, the CPUs' and switches', are not cards.)".format(ignored)
        if ignored else "")
