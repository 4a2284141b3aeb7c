"""The OS around the emulated cards (tools/images/node/files/docker-compat, os-profiles.json): the docker CLI of
an older engine refuses the flags docker added later, exactly as cobra words it, reports the profile's version,
and under SELinux enforcing leaves a container's unlabelled bind mounts unreadable (docs/field-evidence.md O9-O11).
The stand-in runs as a process in front of a recording stand-in for the real docker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FILES = Path(__file__).resolve().parents[2] / "tools" / "images" / "node" / "files"
COMPAT = FILES / "docker-compat"
PROFILES = json.loads((FILES / "os-profiles.json").read_text())
# What the node's docker.io prints; the stand-in rewrites it to the profile's engine.
REAL = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
if args[:1] == ["version"] and "--format" in args:
    fmt = args[args.index("--format") + 1]
    print("20.10.24+dfsg1|20.10.24+dfsg1|1.41|1.41" if "|" in fmt else "20.10.24+dfsg1")
elif args[:1] == ["version"]:
    print("Client:\\n Version:           20.10.24+dfsg1\\n API version:       1.41\\n\\n"
          "Server:\\n Engine:\\n  Version:          20.10.24+dfsg1\\n  API version:      1.41 (minimum version 1.12)")
else:
    print(json.dumps(args))
"""


@pytest.fixture
def docker(tmp_path):
    """docker(os_profile, *args, selinux=None) -> CompletedProcess of the stand-in."""
    real = tmp_path / "docker.real"
    real.write_text(REAL)
    real.chmod(0o755)
    sysfs = tmp_path / "sys"

    def run(profile, *args, selinux=None):
        (tmp_path / "os.json").write_text(json.dumps(dict(PROFILES[profile], sysfs=str(sysfs))))
        if selinux is not None:
            (sysfs / "fs/selinux").mkdir(parents=True, exist_ok=True)
            (sysfs / "fs/selinux/enforce").write_text(selinux)
        env = {**os.environ, "DCU_EMU_DOCKER_REAL": str(real), "DCU_EMU_OS_FILE": str(tmp_path / "os.json"),
               "DCU_EMU_SELINUX_DENIED": str(tmp_path / "denied"), "DCU_EMU_AUDIT_LOG": str(tmp_path / "audit.log")}
        return subprocess.run([sys.executable, str(COMPAT), *args], capture_output=True, text=True, env=env,
                              check=False)
    run.audit_log = tmp_path / "audit.log"
    run.denied = str(tmp_path / "denied")
    return run


def test_docker_18_09_refuses_pull_as_its_cli_does_and_passes_what_it_knows(docker):
    done = docker("kylin-v10", "run", "--rm", "--name=vllm-0", "--pull=never", "--log-driver=none", "img", "vllm")
    assert (done.returncode, done.stdout) == (125, "")
    assert done.stderr == "unknown flag: --pull\nSee 'docker run --help'.\n"
    for flag in (["--gpus", "all"], ["--cgroupns=host"]):
        done = docker("kylin-v10", "container", "create", *flag, "img")
        assert done.returncode == 125 and f"unknown flag: {flag[0].split('=')[0]}" in done.stderr
        assert "See 'docker container create --help'." in done.stderr
    done = docker("kylin-v10", "run", "--rm", "-d", "--security-opt=seccomp=unconfined", "img", "vllm", "--pull")
    assert done.returncode == 0, "a flag of the container's own command is not docker's"
    assert json.loads(done.stdout)[-1] == "--pull"


def test_the_node_s_own_engine_is_left_alone(docker):
    done = docker("debian12", "run", "--pull=never", "img")
    assert done.returncode == 0 and json.loads(done.stdout) == ["run", "--pull=never", "img"]


def test_the_version_is_the_profile_s_engine(docker):
    assert docker("kylin-v10", "version", "--format", "{{.Server.Version}}").stdout.strip() == "18.09.0"
    full = docker("kylin-v10", "version").stdout
    assert "Version:          18.09.0" in full and "API version:      1.39 (minimum version 1.12)" in full
    assert "20.10" not in full
    assert docker("kylin-v10", "--version").stdout == "Docker version 18.09.0, build 4d60db4\n"


def test_selinux_enforcing_hides_unlabelled_bind_mounts_and_logs_the_denial(docker):
    done = docker("kylin-v10", "run", "-v", "/opt/hyhal:/opt/hyhal:ro", "--volume=/srv/models/m:/srv/models/m:ro",
                  "--mount", "type=bind,source=/etc/dcu-serving,target=/etc/dcu-serving,readonly",
                  "-v", "/var/log/dcu-serving:/logs:z", "img", selinux="1")
    args = json.loads(done.stdout)
    assert args[args.index("-v") + 1] == f"{docker.denied}:/opt/hyhal:ro"
    assert f"--volume={docker.denied}:/srv/models/m:ro" in args
    assert f"type=bind,source={docker.denied},target=/etc/dcu-serving,readonly" in args
    assert "/var/log/dcu-serving:/logs:z" in args, "relabelled with :z: readable"
    denials = docker.audit_log.read_text().splitlines()
    assert [line.rsplit('path="', 1)[1].rstrip('"') for line in denials] == [
        "/opt/hyhal", "/srv/models/m", "/etc/dcu-serving"]
    assert all("avc:  denied" in line and "scontext=system_u:system_r:container_t" in line for line in denials)


@pytest.mark.parametrize("opt", [["--security-opt", "label=disable"], ["--security-opt=label:disable"],
                                 ["--privileged"]])
def test_label_disable_or_privileged_keeps_the_mounts(docker, opt):
    done = docker("kylin-v10", "run", *opt, "-v", "/opt/hyhal:/opt/hyhal:ro", "img", selinux="1")
    assert "/opt/hyhal:/opt/hyhal:ro" in json.loads(done.stdout)
    assert not docker.audit_log.exists()


def test_permissive_selinux_denies_nothing(docker):
    done = docker("kylin-v10", "run", "-v", "/opt/hyhal:/opt/hyhal:ro", "img", selinux="0")
    assert "/opt/hyhal:/opt/hyhal:ro" in json.loads(done.stdout)


def _load(name):
    """A node-image script (no .py suffix) as a module."""
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(FILES / name))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_modprobe_d_blacklists_stop_the_boot_s_load_but_not_an_explicit_one(tmp_path, monkeypatch):
    # systemd-modules-load probes with kmod's blacklist applied ("Module 'hycu' is deny-listed (by kmod)"); an
    # explicit `modprobe hycu` (hy-smi --loaddriver, dcu-driver.service) is not blocked (field evidence N6, N7).
    sys.path.insert(0, str(FILES))
    dcuemu = _load("dcuemu.py")
    modprobe_d = tmp_path / "modprobe.d"
    modprobe_d.mkdir()
    (modprobe_d / "hycu.conf").write_text("options hycu hygon_vbios=0\n")
    (modprobe_d / "blacklist-hycu.conf").write_text("# Hygon's installer\nblacklist hycu\n")
    monkeypatch.setattr(dcuemu, "MODPROBE_DIRS", (str(tmp_path / "none"), str(modprobe_d)))
    assert dcuemu.blacklisted("hycu") == [str(modprobe_d / "blacklist-hycu.conf")]
    assert dcuemu.blacklisted("hydcu") == []
    modprobe = _load("modprobe")
    monkeypatch.setattr(modprobe, "dcuemu", dcuemu)
    loaded = []
    monkeypatch.setattr(modprobe, "load", lambda module: loaded.append(module) or 0)
    assert modprobe.main(["-b", "hycu"]) == 0 and loaded == [], "the boot's probe skips it, silently"
    assert modprobe.main(["hycu"]) == 0 and loaded == ["hycu"], "an explicit load ignores the blacklist"
