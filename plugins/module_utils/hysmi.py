# Copyright: dcu-serving contributors
# Apache License 2.0 (see the collection's LICENSE)
"""Read Hygon DCU cards from hy-smi output and from sysfs.

hy-smi prints several formats across driver generations: newer drivers say HCU where older ones say
DCU, JSON keys start at card0 or card1, the JSON may be preceded by banner lines, the PCI bus may carry
a ``--> SN: ...`` suffix and memory comes in MiB or bytes. Every parser here accepts all of them.

sysfs is the fallback that needs no vendor tool: DCUs are the PCI devices of vendor 0x1d94; the card
index is the position in sorted PCI address order, and ``/dev/dri/cardN`` is NOT the index (card0 is
usually the onboard VGA), so DRM nodes are mapped through their ``device`` link's PCI address.
"""

import json
import os
import re

DCU_VENDOR = "0x1d94"
MIB = 1024 * 1024

# PCI device id -> card series (shared/reference/dcu-host.md).
SERIES_BY_DEVICE = {
    "0x6210": "K100_AI",
    "0x62b7": "K100",
    "0x55b7": "Z100L",
    "0x6370": "BW100",
}

# Kernel module names: hydcu for drivers up to 6.2, hycu from 6.3 on.
DRIVER_MODULES = ("hycu", "hydcu")

_CARD_KEY = re.compile(r"^card(\d+)$")
_BDF = re.compile(r"([0-9a-fA-F]{4}:)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")
_TABLE_HEADER = re.compile(r"^\s*(HCU|DCU)\s+\S")
_TABLE_ROW = re.compile(r"^\s*(\d+)\s+\S")
_CARD_LINE = re.compile(r"^\s*(?:HCU|DCU)\[(\d+)\]\s*:\s*(.+?)\s*:\s*(.*?)\s*$")
_DRIVER_VERSION = re.compile(r"Driver Version\s*:\s*(\S+)", re.IGNORECASE)


class HySmiParseError(ValueError):
    """hy-smi printed something that holds no card data."""


def normalize_bdf(text):
    """'0000:06:00.0 --> SN: X' or '06:00.0' -> '0000:06:00.0'; None when no PCI address is present."""
    if not text:
        return None
    match = _BDF.search(str(text))
    if not match:
        return None
    domain = (match.group(1) or "0000:").lower()
    return "{}{}:{}.{}".format(domain, match.group(2).lower(), match.group(3).lower(), match.group(4))


def _number(value):
    try:
        number = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else number


def _memory_mib(card, what):
    """VRAM from '<what> (MiB)' or '<what> (B)' keys, in MiB; keys compared case-insensitively."""
    lowered = {key.lower(): value for key, value in card.items()}
    mib = _number(lowered.get("{} (mib)".format(what.lower())))
    if mib is not None:
        return int(mib)
    size = _number(lowered.get("{} (b)".format(what.lower())))
    if size is not None:
        return int(size // MIB)
    return None


def _json_objects(text):
    """Every JSON object embedded in `text`, in order, skipping banner and log lines around them."""
    decoder = json.JSONDecoder()
    objects, pos = [], 0
    while True:
        start = text.find("{", pos)
        if start < 0:
            return objects
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError:
            pos = start + 1
            continue
        if isinstance(obj, dict):
            objects.append(obj)
        pos = end


def parse_json(text):
    """Parse `hy-smi --json` (any extra flags) into a list of card dicts sorted by index.

    Each card: index, pci_bus, series, numa_node, vram_total_mib, vram_used_mib, serial, raw (the
    original key/value pairs). Indexes are 0-based whether the keys start at card0 or card1.
    """
    cards = {}
    for obj in _json_objects(text):
        for key, value in obj.items():
            match = _CARD_KEY.match(str(key))
            if match and isinstance(value, dict):
                cards.setdefault(int(match.group(1)), {}).update(value)
    if not cards:
        raise HySmiParseError("no card<N> objects in the hy-smi JSON output")
    base = min(cards)
    parsed = []
    for number in sorted(cards):
        raw = cards[number]
        numa = _number(raw.get("(Topology) Numa Node"))
        parsed.append({
            "index": number - base,
            "pci_bus": normalize_bdf(raw.get("PCI Bus")),
            "series": (raw.get("Card Series") or "").strip() or None,
            "numa_node": numa if isinstance(numa, int) else None,
            "vram_total_mib": _memory_mib(raw, "vram Total Memory"),
            "vram_used_mib": _memory_mib(raw, "vram Total Used Memory"),
            "serial": (raw.get("Serial Number") or "").strip() or None,
            "raw": raw,
        })
    return parsed


def parse_table(text):
    """Parse the default hy-smi table: the card indexes and each row's columns by header name.

    Returns (label, rows) where label is 'HCU' or 'DCU' (the header's first column) and rows is a list
    of dicts {'index': int, <header>: <cell>, ...}.
    """
    header, rows = None, []
    for line in text.splitlines():
        if header is None:
            match = _TABLE_HEADER.match(line)
            if match:
                header = line.split()
            continue
        if not _TABLE_ROW.match(line):
            continue
        cells = line.split()
        row = dict(zip(header[1:], cells[1:]))
        row["index"] = int(cells[0])
        rows.append(row)
    if header is None:
        raise HySmiParseError("no HCU/DCU table header in the hy-smi output")
    return header[0], rows


def parse_card_lines(text):
    """Parse 'HCU[0]   : Key: value' lines (hy-smi -a, --showmemavailable) into {index: {key: value}}."""
    cards = {}
    for line in text.splitlines():
        match = _CARD_LINE.match(line)
        if match:
            cards.setdefault(int(match.group(1)), {})[match.group(2)] = match.group(3)
    return cards


def parse_memavailable(text):
    """`hy-smi --showmemavailable` -> {index: available MiB}; byte variants converted to MiB."""
    available = {}
    for index, values in parse_card_lines(text).items():
        mib = _memory_mib(values, "Available memory size")
        if mib is not None:
            available[index] = mib
    return available


def parse_driver_version(text):
    """`hy-smi --showdriverversion` -> the version string, or None."""
    match = _DRIVER_VERSION.search(text)
    return match.group(1) if match else None


def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def discover_sysfs(sysfs_root="/sys"):
    """DCUs from sysfs, sorted by PCI address, with their DRM nodes.

    Each card: index, pci_bus, device_id, series, numa_node, vram_total_mib, card (e.g. 'card1'),
    render (e.g. 'renderD128'); card/render are None when the driver created no node for it.
    """
    pci_dir = os.path.join(sysfs_root, "bus", "pci", "devices")
    cards = {}
    try:
        addresses = sorted(os.listdir(pci_dir))
    except OSError:
        addresses = []
    for bdf in addresses:
        device_dir = os.path.join(pci_dir, bdf)
        if (_read(os.path.join(device_dir, "vendor")) or "").lower() != DCU_VENDOR:
            continue
        device_id = (_read(os.path.join(device_dir, "device")) or "").lower() or None
        vram = _int(_read(os.path.join(device_dir, "mem_info_vram_total")))
        numa = _int(_read(os.path.join(device_dir, "numa_node")))
        cards[normalize_bdf(bdf)] = {
            "pci_bus": normalize_bdf(bdf),
            "device_id": device_id,
            "series": SERIES_BY_DEVICE.get(device_id),
            # The kernel reports -1 when the platform gives no NUMA information.
            "numa_node": numa if numa is not None and numa >= 0 else None,
            "vram_total_mib": vram // MIB if vram is not None else None,
            "card": None,
            "render": None,
        }
    for name, bdf in drm_nodes(sysfs_root).items():
        card = cards.get(bdf)
        if card is None:
            continue
        kind = "render" if name.startswith("renderD") else "card"
        # Several nodes of one kind per device would be unusual; keep the lowest minor.
        if card[kind] is None or _node_minor(name) < _node_minor(card[kind]):
            card[kind] = name
    ordered = [cards[bdf] for bdf in sorted(cards)]
    for index, card in enumerate(ordered):
        card["index"] = index
    return ordered


def _node_minor(name):
    return int(re.sub(r"\D", "", name) or 0)


def drm_nodes(sysfs_root="/sys"):
    """{'card1': '0000:04:00.0', 'renderD128': '0000:04:00.0', ...} for every DRM node with a PCI device."""
    drm_dir = os.path.join(sysfs_root, "class", "drm")
    nodes = {}
    try:
        names = os.listdir(drm_dir)
    except OSError:
        return nodes
    for name in names:
        if not re.match(r"^(card|renderD)\d+$", name):
            continue  # connectors such as card1-DP-1 and the version file
        target = os.path.realpath(os.path.join(drm_dir, name, "device"))
        bdf = normalize_bdf(os.path.basename(target))
        if bdf:
            nodes[name] = bdf
    return nodes


def loaded_driver(sysfs_root="/sys"):
    """(module name, version) of the loaded DCU kernel module, or (None, None) when none is loaded."""
    for module in DRIVER_MODULES:
        module_dir = os.path.join(sysfs_root, "module", module)
        if os.path.isdir(module_dir):
            return module, _read(os.path.join(module_dir, "version"))
    return None, None


def merge_cards(sysfs_cards, smi_cards=None, table_rows=None):
    """Combine hy-smi's view of the cards with sysfs (which alone knows the DRM nodes).

    hy-smi JSON cards are matched to sysfs by PCI address and fall back to position; table rows carry
    only indexes and take everything else from sysfs at the same position. hy-smi values win where
    both have one (sysfs reported NUMA node 0 for every card on old kernels).
    """
    by_bdf = {card["pci_bus"]: card for card in sysfs_cards}
    merged = []
    if smi_cards is not None:
        for position, smi in enumerate(smi_cards):
            sysfs = by_bdf.get(smi["pci_bus"])
            if sysfs is None and smi["pci_bus"] is None and position < len(sysfs_cards):
                sysfs = sysfs_cards[position]
            sysfs = sysfs or {}
            merged.append(_card(
                smi["index"],
                smi["pci_bus"] or sysfs.get("pci_bus"),
                smi["series"] or sysfs.get("series"),
                smi["numa_node"] if smi["numa_node"] is not None else sysfs.get("numa_node"),
                smi["vram_total_mib"] if smi["vram_total_mib"] is not None else sysfs.get("vram_total_mib"),
                sysfs,
            ))
        return merged
    if table_rows is not None:
        for position, row in enumerate(sorted(table_rows, key=lambda row: row["index"])):
            sysfs = sysfs_cards[position] if position < len(sysfs_cards) else {}
            merged.append(_card(row["index"], sysfs.get("pci_bus"), sysfs.get("series"),
                                sysfs.get("numa_node"), sysfs.get("vram_total_mib"), sysfs))
        return merged
    return [_card(card["index"], card["pci_bus"], card["series"], card["numa_node"],
                  card["vram_total_mib"], card) for card in sysfs_cards]


def _card(index, pci_bus, series, numa_node, vram_total_mib, sysfs):
    card, render = sysfs.get("card"), sysfs.get("render")
    return {
        "index": index,
        "pci_bus": pci_bus,
        "series": series,
        "numa_node": numa_node,
        "vram_total_mib": vram_total_mib,
        "card_node": "/dev/dri/" + card if card else None,
        "render_node": "/dev/dri/" + render if render else None,
    }
