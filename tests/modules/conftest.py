"""Fixtures for the module tests: a fake sysfs tree in real layouts, and running a module as Ansible does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO

SAMPLES = Path(__file__).parent / "samples"
DCU_BDFS = ["0000:04:00.0", "0000:05:00.0", "0000:0c:00.0", "0000:0d:00.0",
            "0000:83:00.0", "0000:84:00.0", "0000:8b:00.0", "0000:8c:00.0"]
VGA_BDF = "0000:02:00.0"


@pytest.fixture
def sample():
    """sample("table_hcu.txt") -> the text of tests/modules/samples/table_hcu.txt."""
    return lambda name: (SAMPLES / name).read_text()


@pytest.fixture
def dcu_bdfs():
    return list(DCU_BDFS)


def _write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def make_sysfs(root: Path, cards: int = 8, layout: str = "real", module: tuple[str, str] | None = None,
               render_missing: tuple[int, ...] = (), numa: list[int] | None = None) -> Path:
    """Build a sysfs tree: an onboard VGA (card0) and `cards` K100_AI DCUs (card1.., renderD128..).

    layout "real": devices under devices/pci0000:00/, bus/pci/devices/* and class/drm/* are symlinks
    into it and each node's `device` link points at its PCI device, as on a real host.
    layout "flat": the emulation's layout (docs/emulation.md): PCI devices are directories under
    bus/pci/devices and class/drm/<node>/device links to them.
    """
    bdfs = DCU_BDFS[:cards]
    numa = numa if numa is not None else [0 if i < cards / 2 else 1 for i in range(cards)]
    devices = [(VGA_BDF, "0x1a03", "0x2000", 0, None)] + [
        (bdf, "0x1d94", "0x6210", numa[i], 68702699520) for i, bdf in enumerate(bdfs)]
    pci_bus = root / "bus" / "pci" / "devices"
    pci_bus.mkdir(parents=True)
    drm = root / "class" / "drm"
    drm.mkdir(parents=True)
    for bdf, vendor, device, node, vram in devices:
        if layout == "real":
            device_dir = root / "devices" / "pci0000:00" / bdf
            (pci_bus / bdf).symlink_to(os.path.relpath(device_dir, pci_bus))
        else:
            device_dir = pci_bus / bdf
        _write(device_dir / "vendor", vendor)
        _write(device_dir / "device", device)
        _write(device_dir / "class", "0x038000" if vendor == "0x1d94" else "0x030000")
        _write(device_dir / "numa_node", str(node))
        if vram:
            _write(device_dir / "mem_info_vram_total", str(vram))
    nodes = [("card0", VGA_BDF)]
    for i, bdf in enumerate(bdfs):
        nodes.append((f"card{i + 1}", bdf))
        if i not in render_missing:
            nodes.append((f"renderD{128 + i}", bdf))
    for name, bdf in nodes:
        if layout == "real":
            node_dir = root / "devices" / "pci0000:00" / bdf / "drm" / name
            node_dir.mkdir(parents=True)
            (node_dir / "device").symlink_to("../../../" + bdf)
            (drm / name).symlink_to(os.path.relpath(node_dir, drm))
        else:
            (drm / name).mkdir()
            (drm / name / "device").symlink_to(f"../../../bus/pci/devices/{bdf}")
    if layout == "real":
        # Connectors and the version file live in class/drm too and must be ignored.
        connector = root / "devices" / "pci0000:00" / VGA_BDF / "drm" / "card0" / "card0-VGA-1"
        connector.mkdir()
        (drm / "card0-VGA-1").symlink_to(os.path.relpath(connector, drm))
        _write(drm / "version", "drm 1.1.0 20060810")
    if module:
        _write(root / "module" / module[0] / "version", module[1])
    return root


@pytest.fixture
def fake_sysfs(tmp_path):
    def build(**kwargs) -> Path:
        return make_sysfs(tmp_path / f"sys-{len(list(tmp_path.glob('sys-*')))}", **kwargs)
    return build


def run_module(name: str, args: dict, tmp_path: Path) -> dict:
    """Run plugins/modules/<name>.py as a process with module args, as Ansible does; return its JSON."""
    args_file = tmp_path / f"{name}-args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PYTHONPATH=str(REPO / ".collections"))
    proc = subprocess.run([sys.executable, str(REPO / "plugins" / "modules" / f"{name}.py"), str(args_file)],
                          capture_output=True, text=True, env=env, timeout=60)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{name} printed no JSON (rc {proc.returncode}): {proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1])


@pytest.fixture
def module_runner(tmp_path):
    return lambda name, args: run_module(name, args, tmp_path)


@pytest.fixture
def fake_hy_smi(tmp_path):
    """An executable printing a given sample for each argument list: fake_hy_smi({"--json": "x.txt"})."""
    def build(outputs: dict[str, str | None], rc_missing: int = 1) -> Path:
        table = {key: (SAMPLES / value).read_text() if value else None for key, value in outputs.items()}
        data = tmp_path / "hy-smi-outputs.json"
        data.write_text(json.dumps(table))
        script = tmp_path / "bin" / "hy-smi"
        script.parent.mkdir(exist_ok=True)
        script.write_text(
            f"#!{sys.executable}\n"
            "import json, sys\n"
            f"table = json.load(open({str(data)!r}))\n"
            "out = table.get(' '.join(sys.argv[1:]))\n"
            "if out is None:\n"
            "    print('Error: driver not loaded', file=sys.stderr)\n"
            f"    sys.exit({rc_missing})\n"
            "sys.stdout.write(out)\n"
        )
        script.chmod(0o755)
        return script
    return build
