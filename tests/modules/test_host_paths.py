"""Where the collection puts things on a host is spelled once (module_utils/host_paths.py): the roles read it
through the host_path filter, serving_audit, cluster_health and dcu-doctor import it; the doctor's root-relative
names are the same paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.dcu.serving.plugins.module_utils import host_paths
from dcu_serving.doctor import host as doctor

ROOT = Path(__file__).resolve().parents[2]


def test_the_doctor_reads_the_paths_the_roles_write():
    assert "/etc/" + doctor.PROXY_CONFIG == host_paths.host_path("proxy_config") == "/etc/dcu-serving/proxy.yml"
    assert host_paths.host_path("vllm_env_dir") == "/etc/" + doctor.VLLM_ENV_DIR
    assert host_paths.host_path("vllm_unit") == "/etc/" + doctor.VLLM_UNIT
    assert doctor.Roots().state + "/" + doctor.INSTALL_RECORD == host_paths.host_path("install_record")
    assert host_paths.host_path("reboot_marker") == doctor.REBOOT_MARKER


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(KeyError, match=r"no host path named 'proxy\.yml'; the known ones: access_record, "):
        host_paths.host_path("proxy.yml")
    with pytest.raises(ValueError, match="is not under /opt"):
        host_paths.relative("proxy_config", "/opt")


def test_the_host_path_filter_names_the_path(tmp_path):
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-m", "debug", "-a",
                           "msg={{ 'proxy_config' | dcu.serving.host_path }}"],
                          capture_output=True, text=True, cwd=ROOT, env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                                                                         "PATH": "/usr/bin:/bin"})
    assert "/etc/dcu-serving/proxy.yml" in proc.stdout, proc.stdout + proc.stderr
