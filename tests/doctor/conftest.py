"""Fixtures for dcu-doctor: a converged host in a temporary tree (doctorhost.DoctorHost)."""

from __future__ import annotations

import os

import pytest
from doctor.doctorhost import DoctorHost


@pytest.fixture
def dcu_host(tmp_path):
    # The device nodes belong to groups render and video of the tree's /etc/group: chown needs root.
    if os.geteuid() != 0:
        pytest.skip("the fake device nodes are chowned to their groups, which needs root")
    host = DoctorHost(tmp_path / "host")
    yield host
    host.close()
