"""Fake sysfs trees in the layouts of real DCU hosts, for the module tests (docs/field-evidence.md)."""

from __future__ import annotations

import os
from pathlib import Path

DCU_BDFS = ["0000:04:00.0", "0000:05:00.0", "0000:0c:00.0", "0000:0d:00.0",
            "0000:83:00.0", "0000:84:00.0", "0000:8b:00.0", "0000:8c:00.0"]
# The 8 x BW1100 host of docs/field-evidence.md, in hy-smi's (the driver's DRM) order: not PCI order.
BW_BDFS = ["0000:05:00.0", "0000:2b:00.0", "0000:14:00.0", "0000:1a:00.0",
           "0000:86:00.0", "0000:b8:00.0", "0000:c0:00.0", "0000:9e:00.0"]
VGA_BDF = "0000:02:00.0"
# A Hygon CPU's own vendor-0x1d94 functions (lspci -nn of Hygon hosts, docs/field-evidence.md):
# (address, device, class): root complex, IOMMU, bridges, PSP/CCP, instrumentation, data fabric; and
# the a110 endpoints seen beside the cards in a BW box's switch tree.
PLATFORM = ([("0000:00:00.0", "0x14c0", "0x060000"), ("0000:00:00.2", "0x149e", "0x080600"),
             ("0000:00:01.0", "0x14c2", "0x060000"), ("0000:00:01.1", "0x14c3", "0x060400"),
             ("0000:00:07.1", "0x14c4", "0x060400"), ("0000:49:00.0", "0x14c5", "0x130000"),
             ("0000:49:00.2", "0x14c6", "0x108000"), ("0000:49:00.3", "0x14d8", "0x108000")]
            + [(f"0000:00:18.{fn}", f"0x14d{fn}", "0x060000") for fn in range(8)]
            + [(f"0000:{0x39 + 3 * i:02x}:00.0", "0xa110", "0x068000") for i in range(7)])


def _write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def make_sysfs(root: Path, cards: int = 8, layout: str = "real", module: tuple[str, str] | None = None,
               render_missing: tuple[int, ...] = (), numa: list[int] | None = None, bdfs: list[str] | None = None,
               platform: bool = False, device: str = "0x6210", klass: str = "0x0b4000", drm_base: int = 1,
               bound: bool | None = None, drm: bool = True, switches_bound: bool = False) -> Path:
    """Build a sysfs tree like a DCU host's: `cards` DCUs, an onboard VGA at card0 when drm_base is 1.

    bdfs: the cards' PCI addresses in the driver's registration order (DRM minor order = hy-smi's index);
    default: PCI order. module: (name, version) of the loaded DCU module; version "" means no version file.
    bound: the driver binds the cards (their `driver` link), default when a module is loaded. drm: the
    cards have DRM nodes (card<drm_base + i>, renderD<128 + i>). platform: add a Hygon CPU's and a BW
    switch's own 0x1d94 functions, which are not cards; switches_bound: the driver binds the switch's a110
    endpoints too (no DRM nodes), as Hygon's toolkit allows for (docs/field-evidence.md P8).
    layout "real": devices under devices/pci0000:00/, bus/pci/devices/* and class/drm/* are symlinks
    into it and each node's `device` link points at its PCI device, as on a real host.
    layout "flat": the emulation's layout (docs/emulation.md): PCI devices are directories under
    bus/pci/devices and class/drm/<node>/device links to them.
    """
    bdfs = list(bdfs or DCU_BDFS)[:cards]
    bound = module is not None if bound is None else bound
    numa = numa if numa is not None else [0 if i < cards / 2 else 1 for i in range(cards)]
    devices = [(bdf, "0x1d94", device, klass, numa[i], 68702699520) for i, bdf in enumerate(bdfs)]
    if drm_base:
        devices.append((VGA_BDF, "0x1a03", "0x2000", "0x030000", 0, None))
    if platform:
        devices += [(bdf, "0x1d94", dev, cls, 0, None) for bdf, dev, cls in PLATFORM]
    pci_bus = root / "bus" / "pci" / "devices"
    pci_bus.mkdir(parents=True)
    drm_dir = root / "class" / "drm"
    drm_dir.mkdir(parents=True)
    driver_dir = root / "bus" / "pci" / "drivers" / (module[0] if module else "hycu")
    device_dirs = {}
    for bdf, vendor, dev, cls, node, vram in devices:
        if layout == "real":
            device_dir = root / "devices" / "pci0000:00" / bdf
            device_dir.mkdir(parents=True)
            (pci_bus / bdf).symlink_to(os.path.relpath(device_dir, pci_bus))
        else:
            device_dir = pci_bus / bdf
        device_dirs[bdf] = device_dir
        _write(device_dir / "vendor", vendor)
        _write(device_dir / "device", dev)
        _write(device_dir / "class", cls)
        _write(device_dir / "numa_node", str(node))
        if vram:
            _write(device_dir / "mem_info_vram_total", str(vram))
    if bound:
        driver_dir.mkdir(parents=True)
        switches = [bdf for bdf, dev, _cls in PLATFORM if dev == "0xa110"] if platform and switches_bound else []
        for bdf in bdfs + switches:
            (device_dirs[bdf] / "driver").symlink_to(os.path.relpath(driver_dir, device_dirs[bdf]))
    nodes = [("card0", VGA_BDF)] if drm_base else []
    for i, bdf in enumerate(bdfs if drm else []):
        nodes.append((f"card{drm_base + i}", bdf))
        if i not in render_missing:
            nodes.append((f"renderD{128 + i}", bdf))
    for name, bdf in nodes:
        if layout == "real":
            node_dir = device_dirs[bdf] / "drm" / name
            node_dir.mkdir(parents=True)
            (node_dir / "device").symlink_to("../..")
            (drm_dir / name).symlink_to(os.path.relpath(node_dir, drm_dir))
        else:
            (drm_dir / name).mkdir()
            (drm_dir / name / "device").symlink_to(f"../../../bus/pci/devices/{bdf}")
    if layout == "real" and drm_base:
        # Connectors and the version file live in class/drm too and must be ignored.
        connector = device_dirs[VGA_BDF] / "drm" / "card0" / "card0-VGA-1"
        connector.mkdir()
        (drm_dir / "card0-VGA-1").symlink_to(os.path.relpath(connector, drm_dir))
        _write(drm_dir / "version", "drm 1.1.0 20060810")
    if module:
        (root / "module" / module[0]).mkdir(parents=True)
        if module[1]:
            _write(root / "module" / module[0] / "version", module[1])
    return root
