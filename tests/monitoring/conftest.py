"""What the monitoring tests share: Prometheus' own checking tools."""

from __future__ import annotations

import glob
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def prometheus_tool(tool: str, package: str, tmp_path_factory) -> str:
    """`tool` (promtool, amtool) on PATH or in the venv (make unit installs it: tools/install-prometheus-tool), else
    the one in the built bundle's Debian `package`."""
    found = shutil.which(tool) or shutil.which(tool, path=str(Path(sys.executable).parent))
    if found:
        return found
    debs = sorted(glob.glob(str(ROOT / "build" / "bundle" / "debs" / f"{package}_*.deb")))
    if debs and shutil.which("dpkg-deb"):
        out = tmp_path_factory.mktemp(f"{package}-deb")
        subprocess.run(["dpkg-deb", "-x", debs[-1], str(out)], check=True)
        return str(out / "usr" / "bin" / tool)
    pytest.skip(f"no {tool}: make unit installs it (tools/install-prometheus-tool .venv/bin/{tool})")


@pytest.fixture(scope="module")
def promtool(tmp_path_factory) -> str:
    return prometheus_tool("promtool", "prometheus", tmp_path_factory)


@pytest.fixture(scope="module")
def amtool(tmp_path_factory) -> str:
    return prometheus_tool("amtool", "prometheus-alertmanager", tmp_path_factory)
