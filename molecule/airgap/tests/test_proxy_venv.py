"""dcu_proxy_runtime: auto on `air-host`, which picks the venv (the node's python3 is 3.11): dcu-serving[proxy]
only, built beside the running venv and switched to atomically; a broken wheelhouse changes nothing."""

from __future__ import annotations

import hashlib
import uuid

from proxycalls import call, command_line, main_pid, results_line
from testkit import bundle_copy, rebuild_wheel, wheel_entry

testinfra_hosts = ["air-host"]
VENV = "/opt/dcu-serving/venv"


def test_auto_built_a_venv_of_the_proxys_dependencies_only(host):
    venv = host.file(VENV)
    assert venv.is_symlink and venv.linked_to.startswith(VENV + "-")
    python = f"{VENV}/bin/python"
    assert host.run(f"{python} -c 'import aiohttp, uvloop, orjson, dcu_serving.proxy'").rc == 0
    for absent in ("pydantic", "PIL", "requests"):
        assert host.run(f"{python} -c 'import {absent}'").rc != 0, absent
    pinned = [line for line in host.file(f"{VENV}/bundle-requirements.txt").content_string.splitlines()
              if line and not line.startswith("#")]
    assert pinned and all(" --hash=sha256:" in line for line in pinned)
    assert not any(line.startswith(("pydantic", "pillow", "requests")) for line in pinned)


def test_a_broken_wheelhouse_leaves_the_running_proxy_serving(host, run_playbook, tmp_path):
    """A newer bundle whose multidict wheel does not match its sum: pip refuses it, nothing switches."""
    def damage(index, root):
        wheel_entry(index, "multidict")["sha256"] = hashlib.sha256(b"another file").hexdigest()

    link, pid = host.file(VENV).linked_to, main_pid(host)
    rc, out = run_playbook("serving.yml", "--limit", "air-host",
                           extra_vars={"dcu_proxy_bundle_dir": bundle_copy(tmp_path, "broken", damage)})
    assert rc != 0 and "DO NOT MATCH THE HASHES" in out, out[-3000:]
    assert host.file(VENV).linked_to == link and main_pid(host) == pid
    orid = f"air-host-{uuid.uuid4().hex[:8]}"
    assert call(host, orid)["status"] == 200 and results_line(host, orid)["status"] == 200


def test_a_new_wheelhouse_is_switched_to_and_the_previous_venv_kept_for_a_rollback(host, run_playbook, tmp_path):
    def rebuild(index, root):  # a rebuilt dcu-serving wheel (one more file), index.json updated
        rebuild_wheel(index, root, "dcu-serving")

    old, pid = host.file(VENV).linked_to, main_pid(host)
    built = host.check_output(f"stat --format=%Y {old}/dcu-serving-wheels.sha256")
    rc, out = run_playbook("serving.yml", "--limit", "air-host",
                           extra_vars={"dcu_proxy_bundle_dir": bundle_copy(tmp_path, "newer", rebuild)})
    assert rc == 0, out[-3000:]
    new = host.file(VENV).linked_to
    assert new != old and host.file(f"{VENV}.previous").linked_to == old
    assert host.file(f"{VENV}/lib/python3.11/site-packages/dcu_serving/_rebuilt.txt").exists
    assert main_pid(host) != pid and new in command_line(host, main_pid(host))
    assert call(host, f"air-host-{uuid.uuid4().hex[:8]}")["status"] == 200
    # The scenario's bundle again: its venv is the one kept, switched back to without a build.
    rc, out = run_playbook("serving.yml", "--limit", "air-host")
    assert rc == 0, out[-3000:]
    assert host.file(VENV).linked_to == old and host.file(f"{VENV}.previous").linked_to == new
    assert host.check_output(f"stat --format=%Y {old}/dcu-serving-wheels.sha256") == built
    assert old in command_line(host, main_pid(host))
    assert call(host, f"air-host-{uuid.uuid4().hex[:8]}")["status"] == 200


def test_a_running_venv_whose_marker_cannot_be_read_is_kept_and_the_build_goes_beside_it(host, run_playbook):
    """The marker of the venv the proxy runs from is gone (a disk error, a hand that cleaned up): the role cannot
    tell that venv is this bundle's, and the build used to begin by removing it under the running proxy. It builds
    <venv>-<digest>-2 beside it, restarts the proxy onto it and keeps the old one as the previous."""
    running, pid = host.file(VENV).linked_to, main_pid(host)
    host.check_output(f"mv {running}/dcu-serving-wheels.sha256 {running}/dcu-serving-wheels.sha256.lost")
    rc, out = run_playbook("serving.yml", "--limit", "air-host")
    assert rc == 0, out[-3000:]
    new = host.file(VENV).linked_to
    assert new == running + "-2" and host.file(f"{VENV}.previous").linked_to == running
    assert host.file(f"{running}/pyvenv.cfg").exists and host.file(f"{running}/bin/dcu-proxy").exists
    assert main_pid(host) != pid and new in command_line(host, main_pid(host))
    assert call(host, f"air-host-{uuid.uuid4().hex[:8]}")["status"] == 200
    # The -2 has its marker: the next run builds nothing and switches nothing.
    built = host.check_output(f"stat --format=%Y {new}/dcu-serving-wheels.sha256")
    rc, out = run_playbook("serving.yml", "--limit", "air-host")
    assert rc == 0, out[-3000:]
    assert host.file(VENV).linked_to == new and host.file(f"{VENV}.previous").linked_to == running
    assert host.check_output(f"stat --format=%Y {new}/dcu-serving-wheels.sha256") == built
