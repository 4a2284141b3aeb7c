# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Read Hygon DCU cards from sysfs and from hy-smi, the way they look on real hosts.

Which devices are cards is sysfs's answer. Hygon CPUs expose PCI functions with the DCU vendor id 0x1d94
too (root complexes, IOMMU, the PSP/crypto coprocessor, data fabric; BW boxes add PCIe switch functions),
so a two-socket host lists well over a hundred 0x1d94 functions. A card is a 0x1d94 device that the DCU
driver (hycu, or hydcu up to 6.2) binds or that has DRM nodes, as Hygon's container toolkit reads them.
A display-class 0x1d94 device or a known DCU device id without either is a card the driver did not bind.

The card index is hy-smi's (HCU[N]), which is what HIP_VISIBLE_DEVICES and operators use. It is NOT the
PCI address order: hy-smi numbers cards in the order the driver registered them (the DRM minor order of
its rocm-smi lineage). So hy-smi rows are matched to sysfs devices by PCI address, never by position,
and without hy-smi the index is the DRM card order. DRM nodes always come from sysfs: /dev/dri/cardN is
not the index either (card0 is usually the onboard VGA).

hy-smi is not a clean JSON API: it needs its daemon (hymgr), may refuse --json without field flags, has
printed log lines before the JSON and JSON with missing commas, says HCU or DCU, numbers cards from card0
or card1 and gives memory in MiB or bytes. Every parser here accepts all of that (docs/field-evidence.md).
"""

import json
import os
import re

DCU_VENDOR = "0x1d94"
MIB = 1024 * 1024

# PCI device id -> card series (shared/reference/dcu-host.md, docs/field-evidence.md).
SERIES_BY_DEVICE = {
    "0x6210": "K100_AI",
    "0x62b7": "K100",
    "0x55b7": "Z100L",
    "0x54b7": "Z100",
    "0x6370": "BW100",
    "0x6320": "BW1000",  # also BW150
    "0x6430": "BW1100",
    "0x6211": "K100_AI_ECO",
}

# Card series joined by PCIe only, without HLink (xGMI-like) bridges: K100, K100_AI, Z100, Z100L and BW10/BW100/BW150
# are PCIe cards (tensor parallel over them needs IOMMU pass-through, ACS off, HSA_FORCE_FINE_GRAIN_PCIE=1 and no
# custom all-reduce: docs/field-evidence.md K1, K2); BW1000 and BW1100 are OAM modules on HLink (installer log
# "Selected hlink type: OAM_7HSW_8HCU"). Used by the services (plugin_utils/services.py) and dcu-doctor.
PCIE_ONLY_SERIES = frozenset(["K100", "K100_AI", "K100_AI_ECO", "Z100", "Z100L", "BW10", "BW100", "BW150"])
HLINK_SERIES = frozenset(["BW1000", "BW1100"])


def series_key(series):
    """'K100-AI' and 'k100 ai' -> 'K100_AI': series names as the sets above spell them."""
    return re.sub(r"[-\s]+", "_", str(series or "").strip().upper())


def interconnect(series_list):
    """'hlink' when every card is an HLink (OAM) series, 'pcie' when one is PCIe-only, else 'unknown' (hy-smi says
    only 'BW' on some boxes: treat as PCIe, whose settings are harmless on HLink)."""
    keys = [series_key(s) for s in series_list]
    if keys and all(k in HLINK_SERIES for k in keys):
        return "hlink"
    if any(k in PCIE_ONLY_SERIES for k in keys):
        return "pcie"
    return "unknown"


# Kernel module names: hydcu for drivers up to 6.2, hycu from 6.3 on.
DRIVER_MODULES = ("hycu", "hydcu")

# PCI classes a DCU reports: Z100L is a display controller (0x0380), K100, K100_AI and BW are co-processors
# (0x0b40); 0x12 (processing accelerator) is GPUStack's guess too. Anything else with vendor 0x1d94 (host and
# PCI bridges 0x06, IOMMU 0x0806, encryption 0x1080, instrumentation 0x1300, ...) is a CPU or switch function.
CARD_CLASSES = ("0x03", "0x12", "0x0b40")

# What hy-smi is asked for: named fields, never bare --json (refused on some drivers).
FIELD_FLAGS = ["--showbus", "--showproductname", "--showmeminfo", "vram", "--showtoponuma"]
# The readings a metrics exporter asks for, in one call; --showbus so rows match sysfs by PCI address.
METRIC_FLAGS = ["--showbus", "--showmeminfo", "vram", "--showuse", "--showtemp", "--showpower"]

_CARD_KEY = re.compile(r"^card(\d+)$", re.IGNORECASE)
_BDF = re.compile(r"(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])\b")
_TABLE_HEADER = re.compile(r"^\s*(HCU|DCU)\s+\S")
_TABLE_ROW = re.compile(r"^\s*(\d+)\s+\S")
# 'HCU[0]          : PCI Bus: 0000:05:00.0', rocm-smi's tab-separated 'GPU[0]\t\t: ...', ROCm 5's 'GPU 0   : ...'
_CARD_LINE = re.compile(r"^\s*(?:HCU|DCU|GPU)\s*\[?\s*(\d+)\s*\]?\s*:\s*(.*?)\s*$")
_KEY_VALUE = re.compile(r"^(.*?):\s+(.*)$")
# hy-smi --showtopo prints no colon: '(Topology) Numa Node 0'
_KEY_LAST_WORD = re.compile(r"^(.*\S)\s+(\S+)$")
_DRIVER_VERSION = re.compile(r"Driver\s+Version\s*:?\s*(\S+)", re.IGNORECASE)

# Field names across drivers, compared case-insensitively.
_PCI_KEYS = ("pci bus",)
_SERIES_KEYS = ("card series", "card sku", "card model")
_NUMA_KEYS = ("(topology) numa node", "numa node")
_VRAM_TOTAL = "vram total memory"
_VRAM_USED = "vram total used memory"
_USE_KEYS = ("hcu use (%)", "dcu use (%)", "gpu use (%)")
# Junction first: the hottest sensor, the one the default table's Temp column shows; edge where it is missing.
_TEMPERATURE_KEYS = ("temperature (sensor junction) (c)", "temperature (sensor edge) (c)")
# rocm-smi's newer name for the same reading is 'Current Socket Graphics Package Power (W)'.
_POWER_KEYS = ("average graphics package power (w)", "current socket graphics package power (w)")


class HySmiParseError(ValueError):
    """hy-smi printed something that holds no card data."""


# --- sysfs -------------------------------------------------------------------------------------------


def normalize_bdf(text):
    """'0000:06:00.0 --> SN: X' or '06:00.0' -> '0000:06:00.0'; None when no PCI address is present."""
    if not text:
        return None
    match = _BDF.search(str(text))
    if not match:
        return None
    domain = (match.group(1) or "0000").lower()
    return "{}:{}:{}.{}".format(domain, match.group(2).lower(), match.group(3).lower(), match.group(4))


def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text):
    try:
        return int(text, 0) if isinstance(text, str) and text.startswith("0x") else int(text)
    except (TypeError, ValueError):
        return None


def _node_minor(name):
    digits = re.sub(r"\D", "", name or "")
    return int(digits) if digits else None


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
            continue  # connectors such as card1-DP-1, and the version file
        bdf = normalize_bdf(os.path.basename(os.path.realpath(os.path.join(drm_dir, name, "device"))))
        if bdf:
            nodes[name] = bdf
    return nodes


def pci_functions(sysfs_root="/sys"):
    """Every PCI function of vendor 0x1d94, sorted by address, with what sysfs says about it.

    Each: pci_bus, device_id, class (e.g. '0x038000'), driver (the bound driver's name or None),
    numa_node, vram_total_mib, card and render (DRM node names or None), kind:
    'card'            a function with DRM nodes (what Hygon's container toolkit and GPUStack count);
    'unbound'         a card by device id or class without DRM nodes: the driver is not loaded, or it bound the
                      card and could not bring it up (a driver/vbios mismatch): unusable either way;
    'driver_function' a function the DCU driver binds that is not a card (no card id or class, no DRM nodes):
                      the BW boxes' a110 switch endpoints, when the driver binds them;
    'platform'        any other 0x1d94 function: the CPU's and the switches' own.
    """
    pci_dir = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        addresses = sorted(os.listdir(pci_dir))
    except OSError:
        addresses = []
    functions = {}
    for address in addresses:
        device_dir = os.path.join(pci_dir, address)
        if (_read(os.path.join(device_dir, "vendor")) or "").lower() != DCU_VENDOR:
            continue
        bdf = normalize_bdf(address)
        device_id = (_read(os.path.join(device_dir, "device")) or "").lower() or None
        driver_link = os.path.join(device_dir, "driver")
        driver = os.path.basename(os.path.realpath(driver_link)) if os.path.islink(driver_link) else None
        vram = _int(_read(os.path.join(device_dir, "mem_info_vram_total")))
        numa = _int(_read(os.path.join(device_dir, "numa_node")))
        functions[bdf] = {
            "pci_bus": bdf,
            "device_id": device_id,
            "class": (_read(os.path.join(device_dir, "class")) or "").lower() or None,
            "driver": driver,
            # The kernel reports -1 when the platform gives no NUMA information.
            "numa_node": numa if numa is not None and numa >= 0 else None,
            "vram_total_mib": vram // MIB if vram is not None else None,
            "card": None,
            "render": None,
        }
    for name, bdf in drm_nodes(sysfs_root).items():
        function = functions.get(bdf)
        if function is None:
            continue
        kind = "render" if name.startswith("renderD") else "card"
        # Several nodes of one kind per device would be unusual; keep the lowest minor.
        if function[kind] is None or _node_minor(name) < _node_minor(function[kind]):
            function[kind] = name
    for function in functions.values():
        function["kind"] = _kind(function)
    return [functions[bdf] for bdf in sorted(functions)]


def _kind(function):
    if function["card"] or function["render"]:
        return "card"
    if function["device_id"] in SERIES_BY_DEVICE or (function["class"] or "").startswith(CARD_CLASSES):
        return "unbound"
    if function["driver"] in DRIVER_MODULES:
        return "driver_function"
    return "platform"


def sysfs_cards(functions):
    """The cards among pci_functions(), in DRM order (hy-smi's order), each with its index."""
    cards = [dict(f) for f in functions if f["kind"] == "card"]

    def drm_order(card):
        card_minor, render_minor = _node_minor(card["card"]), _node_minor(card["render"])
        return (card_minor is None, card_minor or 0, render_minor is None, render_minor or 0, card["pci_bus"])

    cards.sort(key=drm_order)
    for index, card in enumerate(cards):
        card["index"] = index
    return cards


def loaded_driver(sysfs_root="/sys"):
    """(module name, version or None) of the loaded DCU kernel module, or (None, None).

    /sys/module/<name>/version may be missing even while the module is loaded: the caller asks hy-smi.
    """
    for module in DRIVER_MODULES:
        module_dir = os.path.join(sysfs_root, "module", module)
        if os.path.isdir(module_dir):
            return module, _read(os.path.join(module_dir, "version")) or None
    return None, None


# --- hy-smi ------------------------------------------------------------------------------------------


def json_objects(text):
    """Every JSON object in `text`, in order, skipping log lines around them and mending missing commas."""
    decoder = json.JSONDecoder()
    objects, pos = [], 0
    while True:
        start = text.find("{", pos)
        if start < 0:
            return objects
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError:
            obj, end = _mended(text, start, decoder)
            if obj is None:
                pos = start + 1
                continue
        if isinstance(obj, dict):
            objects.append(obj)
        pos = end


def _mended(text, start, decoder):
    """Decode the object at `start` after putting back the commas hy-smi left out; (None, start) if it fails.

    hy-smi has printed `"91.0""Average GFX Core Power (W)": "20.0"`: a value directly followed by the next
    key. Outside strings, a string or object that starts right after a complete value gets a comma.
    """
    out, depth, in_string, escaped, after_value = [], 0, False, False, False
    for pos in range(start, len(text)):
        char = text[pos]
        if in_string:
            out.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string, after_value = False, True
            continue
        if char in '"{' and after_value:
            out.append(",")
        if char == '"':
            in_string = True
        elif char in "{[":
            depth += char == "{"
            after_value = False
        elif char in "}]":
            depth -= char == "}"
            after_value = True
        elif char in ":,":
            after_value = False
        elif not char.isspace():
            after_value = True  # a number, true, false or null
        out.append(char)
        if depth == 0:
            try:
                return decoder.decode("".join(out)), pos + 1
            except ValueError:
                return None, start
    return None, start


def parse_fields_json(text):
    """hy-smi --json (with field flags) -> {index: {field: value}}; 0-based whether keys start at card0 or card1."""
    cards = {}
    for obj in json_objects(text):
        for key, value in obj.items():
            match = _CARD_KEY.match(str(key))
            if match and isinstance(value, dict):
                cards.setdefault(int(match.group(1)), {}).update(value)
    if not cards:
        raise HySmiParseError("no card<N> objects in the hy-smi JSON output")
    base = min(cards)
    return {number - base: fields for number, fields in cards.items()}


def parse_card_lines(text):
    """'HCU[0]   : PCI Bus: 0000:05:00.0' lines (hy-smi with field flags, -a) -> {index: {field: value}}."""
    cards = {}
    for line in text.splitlines():
        match = _CARD_LINE.match(line)
        if not match:
            continue
        pair = _KEY_VALUE.match(match.group(2)) or _KEY_LAST_WORD.match(match.group(2))
        if pair:
            cards.setdefault(int(match.group(1)), {})[pair.group(1).strip()] = pair.group(2).strip()
    return cards


def parse_fields_text(text):
    cards = parse_card_lines(text)
    if not cards:
        raise HySmiParseError("no HCU[N]/DCU[N] lines in the hy-smi output")
    return cards


def _field(fields, names):
    lowered = {str(key).strip().lower(): value for key, value in fields.items()}
    for name in names:
        if name in lowered and str(lowered[name]).strip():
            return str(lowered[name]).strip()
    return None


def _number(value):
    try:
        number = float(str(value).strip().rstrip("%"))
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else number


def _memory_bytes(fields, what):
    """VRAM from '<what> (MiB)' or '<what> (B)' fields, in bytes (exact when hy-smi gave bytes)."""
    mib = _number(_field(fields, ["{} (mib)".format(what)]))
    if mib is not None:
        return int(mib * MIB)
    size = _number(_field(fields, ["{} (b)".format(what)]))
    return int(size) if size is not None else None


def _memory_mib(fields, what):
    """VRAM from '<what> (MiB)' or '<what> (B)' fields, in MiB."""
    size = _memory_bytes(fields, what)
    return size // MIB if size is not None else None


def smi_cards(fields_by_index):
    """{index: fields} -> [{index, pci_bus, series, numa_node, vram_total_mib, vram_used_mib, serial}]."""
    cards = []
    for index in sorted(fields_by_index):
        fields = fields_by_index[index]
        numa = _number(_field(fields, _NUMA_KEYS))
        cards.append({
            "index": index,
            "pci_bus": normalize_bdf(_field(fields, _PCI_KEYS)),
            "series": _field(fields, _SERIES_KEYS),
            "numa_node": numa if isinstance(numa, int) and numa >= 0 else None,
            "vram_total_mib": _memory_mib(fields, _VRAM_TOTAL),
            "vram_used_mib": _memory_mib(fields, _VRAM_USED),
            "serial": _field(fields, ("serial number",)),
        })
    return cards


def smi_readings(fields_by_index):
    """{index: fields} (hy-smi with METRIC_FLAGS) -> one dict per card, None where hy-smi gave no value:
    index, pci_bus, use_percent, vram_total_bytes, vram_used_bytes, temperature_c, power_w."""
    readings = []
    for index in sorted(fields_by_index):
        fields = fields_by_index[index]
        readings.append({
            "index": index,
            "pci_bus": normalize_bdf(_field(fields, _PCI_KEYS)),
            "use_percent": _number(_field(fields, _USE_KEYS)),
            "vram_total_bytes": _memory_bytes(fields, _VRAM_TOTAL),
            "vram_used_bytes": _memory_bytes(fields, _VRAM_USED),
            "temperature_c": _number(_field(fields, _TEMPERATURE_KEYS)),
            "power_w": _number(_field(fields, _POWER_KEYS)),
        })
    return readings


def parse_table(text):
    """The default hy-smi table -> (label, rows): label 'HCU' or 'DCU', rows [{'index': N, <header>: cell}]."""
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


def parse_driver_version(text):
    """`hy-smi --showdriverversion` (text or JSON) -> the version string, or None."""
    for obj in json_objects(text or ""):
        for value in obj.values():
            found = _field(value, ("driver version",)) if isinstance(value, dict) else None
            if found:
                return found
    match = _DRIVER_VERSION.search(text or "")
    return match.group(1).strip('",') if match else None


def explain_failure(output):
    """What an hy-smi failure means and what to do, from its output; None when not recognised."""
    lowered = (output or "").lower()
    if "connect server failed" in lowered or "connect to server" in lowered or "hymgr" in lowered:
        return "hy-smi cannot reach the hymgr daemon: start it (systemctl start hymgr) and check its log"
    if "concise output" in lowered:
        return "this hy-smi refuses --json without field flags"
    if "not loaded" in lowered or "no hcu" in lowered or "no dcu" in lowered:
        return "the DCU driver is not loaded (hy-smi --loaddriver, or reboot after installing rock)"
    return None


# --- both --------------------------------------------------------------------------------------------


def merge(functions, smi=None):
    """The cards: sysfs's devices with hy-smi's index and readings where hy-smi answered.

    Returns (cards, problems). hy-smi rows are matched by PCI address; a row whose address sysfs does not
    know, or that has none, is reported and dropped (sysfs decides which devices exist). A sysfs card that
    hy-smi does not list keeps a place after hy-smi's in DRM order, and is reported. hy-smi's NUMA node
    wins where both have one: old kernels reported 0 for every card in sysfs.
    """
    by_bdf = {card["pci_bus"]: card for card in sysfs_cards(functions)}
    problems = []
    if smi is None:
        return [_card(card["index"], card, {}) for card in sorted(by_bdf.values(), key=lambda c: c["index"])], problems
    cards, seen = [], set()
    for row in smi:
        sysfs = by_bdf.get(row["pci_bus"])
        if sysfs is None:
            problems.append("hy-smi lists card {} at PCI {}, which sysfs does not show as a DCU card".format(
                row["index"], row["pci_bus"] or "(no address)"))
            continue
        seen.add(row["pci_bus"])
        cards.append(_card(row["index"], sysfs, row))
    next_index = max([card["index"] for card in cards] + [-1]) + 1
    for sysfs in sorted(by_bdf.values(), key=lambda c: c["index"]):
        if sysfs["pci_bus"] not in seen:
            problems.append("sysfs shows a DCU card at PCI {} that hy-smi does not list".format(sysfs["pci_bus"]))
            cards.append(_card(next_index, sysfs, {}))
            next_index += 1
    return sorted(cards, key=lambda card: card["index"]), problems


def _card(index, sysfs, smi):
    def pick(key):
        value = smi.get(key)
        return value if value is not None else sysfs.get(key)

    return {
        "index": index,
        "pci_bus": sysfs["pci_bus"],
        "device_id": sysfs.get("device_id"),
        "series": pick("series") or SERIES_BY_DEVICE.get(sysfs.get("device_id")),
        "numa_node": pick("numa_node"),
        "vram_total_mib": pick("vram_total_mib"),
        "driver": sysfs.get("driver"),
        "card_node": "/dev/dri/" + sysfs["card"] if sysfs.get("card") else None,
        "render_node": "/dev/dri/" + sysfs["render"] if sysfs.get("render") else None,
    }


def describe_function(function):
    """One line an operator can act on: '0000:05:00.0 (0x6370 BW100): driver none, no DRM nodes'."""
    series = SERIES_BY_DEVICE.get(function.get("device_id"))
    nodes = [node for node in (function.get("card"), function.get("render")) if node]
    return "{} ({}{}): driver {}, {}".format(
        function["pci_bus"], function.get("device_id") or "unknown id", " " + series if series else "",
        function.get("driver") or "none", "DRM nodes " + "+".join(nodes) if nodes else "no DRM nodes")
