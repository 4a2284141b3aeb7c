"""Fixtures for dcu-exporter: a fake hy-smi, and the exporter serving for real on a free port."""

from __future__ import annotations

from pathlib import Path

import pytest
from exporter.exportertools import FakeHySmi, make_fake_hy_smi

from dcu_serving.exporter.cli import parser, serve


@pytest.fixture
def fake_hy_smi(tmp_path):
    """fake_hy_smi(json_samples=[...], text_sample=...) -> FakeHySmi (see exportertools.make_fake_hy_smi)."""
    made = []

    def build(**outputs) -> FakeHySmi:
        made.append(make_fake_hy_smi(tmp_path / f"hyhal-{len(made)}", **outputs))
        return made[-1]
    return build


@pytest.fixture
def exporter():
    """exporter(hy_smi, sysfs_root, "--min-interval", "0", ...) -> the /metrics URL of a dcu-exporter serving
    on a free loopback port (in this process, as `dcu-exporter` serves); stopped after the test."""
    servers = []

    def start(hy_smi: FakeHySmi | Path, sysfs_root: Path, *options: str) -> str:
        path = hy_smi.path if isinstance(hy_smi, FakeHySmi) else hy_smi
        args = parser().parse_args(["--listen", "127.0.0.1:0", "--hy-smi", str(path),
                                    "--sysfs-root", str(sysfs_root), *options])
        server = serve(args)
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/metrics"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
