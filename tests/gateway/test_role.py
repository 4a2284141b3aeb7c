"""roles/dcu_gateway for real: playbooks/gateway.yml on an emulated node (real systemd, Debian 12's Python), the
venv built from a bundle made of requirements/gateway.txt's wheels. Converges, changes nothing the second time
or in check mode, runs LiteLLM as dcu-gateway, keeps no key in clear and shows none, answers 401 to a wrong key,
and a rotated key works at once without a restart.

The bundle's wheels come from build/gateway-wheels (`make gateway` downloads them): no registry is asked here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import pytest
import yaml

from support import REPO

pytestmark = [pytest.mark.gateway, pytest.mark.docker]

WHEELS = REPO / "build/gateway-wheels"
MASTER = "sk-master-" + uuid.uuid4().hex
OLD, NEW = "sk-billing-" + uuid.uuid4().hex, "sk-billing-" + uuid.uuid4().hex


def run(*argv, check=True, **kw):
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if check and done.returncode != 0:
        raise AssertionError(f"{argv[:3]} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
    return done


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    if not WHEELS.is_dir():
        pytest.fail(f"{WHEELS} is missing: `make gateway` downloads the gateway's wheels there")
    out = tmp_path_factory.mktemp("gw") / "bundle"
    manifest = out.parent / "manifest.json"
    manifest.write_text(json.dumps({"wheels": {
        "python_version": "3.11", "platforms": ["manylinux_2_36_x86_64"], "requirements": [],
        "local_projects": [str(REPO)], "no_deps": True, "hashed": [str(REPO / "requirements/gateway.txt")]}}))
    run(sys.executable, "-m", "dcu_serving.bundle", "build", "--manifest", str(manifest), "--out", str(out),
        env={**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELS)})
    return out


@pytest.fixture(scope="module")
def node():
    name = f"dcu-gw-test-{uuid.uuid4().hex[:6]}"
    run(str(REPO / "tools/dcu-node"), "up", name, "--cards", "1", "--network", "none")
    yield name
    run(str(REPO / "tools/dcu-node"), "down", name, check=False)


def converge(tmp, node, bundle, callers, *args):
    inventory = {
        "dcu_gateways": {"hosts": {node: {"ansible_connection": "community.docker.docker"}}},
        "dcu_nodes": {"hosts": {
            "serving-a": {"ansible_host": "10.0.0.11"},
            "serving-b": {"ansible_host": "10.0.0.12", "dcu_proxy_listen": "0.0.0.0:8080",
                          "dcu_vllm_services": [{"name": "chat", "models": ["MiniCPM-V-4.5"]},
                                                {"name": "embed", "models": ["bge-m3"]}]}}},
        "all": {"vars": {"dcu_bundle_dir": str(bundle), "dcu_gateway_master_key": MASTER,
                         "dcu_gateway_callers": callers}},
    }
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory))
    done = run(os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(tmp / "hosts.yml"),
               str(REPO / "playbooks/gateway.yml"), *args, check=False, cwd=REPO,
               env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    changed = re.search(rf"^{re.escape(node)}\s*:.*changed=(\d+)", out, re.M)
    return int(changed.group(1)), out


def call(node, key, path="/v1/models"):
    """A request from the node itself (the container has no other network), as the host's own check would."""
    probe = ("import sys, urllib.request as u, urllib.error as e\n"
             f"r = u.Request('http://127.0.0.1:4000{path}', headers={{'Authorization': 'Bearer ' + sys.argv[1]}})\n"
             "try:\n    print(u.urlopen(r, timeout=10).status)\nexcept e.HTTPError as err:\n    print(err.code)\n")
    return int(run("docker", "exec", node, "python3", "-c", probe, key).stdout.strip())


def test_the_gateway_role_converges_hardened_keeps_no_key_in_clear_and_rotates_without_restart(
        tmp_path, node, bundle):
    callers = [{"alias": "billing", "key": OLD, "concurrent": 8}, {"alias": "batch", "key": "sk-b-" + "x" * 20,
                                                                  "rpm": 60}]
    first, out = converge(tmp_path, node, bundle, callers)
    assert first > 0
    assert OLD not in out and MASTER not in out  # no_log: no secret in the play's output
    assert converge(tmp_path, node, bundle, callers)[0] == 0
    assert converge(tmp_path, node, bundle, callers, "--check", "--diff")[0] == 0

    # LiteLLM as the service user; the models of both hosts; a wrong key refused.
    shown = run("docker", "exec", node, "systemctl", "show", "dcu-gateway", "-p", "User", "-p", "MainPID",
                "-p", "ActiveState").stdout
    assert "User=dcu-gateway" in shown and "ActiveState=active" in shown
    pid = re.search(r"MainPID=(\d+)", shown).group(1)
    assert call(node, OLD) == 200 and call(node, "sk-nobody-0123456789") == 401

    # Secrets on disk: only digests in the keys file (0600, the service user); the master key 0600 root.
    modes = run("docker", "exec", node, "stat", "-c", "%n %a %U", "/etc/dcu-gateway/keys.json",
                "/etc/dcu-gateway/secrets.env", "/etc/dcu-gateway/config.yaml").stdout.split("\n")
    assert modes[:3] == ["/etc/dcu-gateway/keys.json 600 dcu-gateway", "/etc/dcu-gateway/secrets.env 600 root",
                         "/etc/dcu-gateway/config.yaml 640 root"]
    everything = run("docker", "exec", node, "sh", "-c", "cat /etc/dcu-gateway/keys.json /etc/dcu-gateway/config.yaml")
    assert OLD not in everything.stdout and MASTER not in everything.stdout
    config = yaml.safe_load(run("docker", "exec", node, "cat", "/etc/dcu-gateway/config.yaml").stdout)
    assert sorted((d["model_name"], d["litellm_params"]["api_base"]) for d in config["model_list"]) == [
        ("MiniCPM-V-4.5", "http://10.0.0.11:8000/v1"), ("MiniCPM-V-4.5", "http://10.0.0.12:8080/v1"),
        ("bge-m3", "http://10.0.0.12:8080/v1")]

    # Rotation: the new key works and the old is refused at once, with no restart.
    callers[0]["key"] = NEW
    assert converge(tmp_path, node, bundle, callers)[0] == 1  # the keys file, nothing else
    assert call(node, NEW) == 200 and call(node, OLD) == 401
    assert f"MainPID={pid}" in run("docker", "exec", node, "systemctl", "show", "dcu-gateway", "-p", "MainPID").stdout
