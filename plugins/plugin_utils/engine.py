# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What a host's container engine and SELinux mean for the containers our units run, from ansible_facts.dcu_host
(host_probe's host facts): the `docker run` options every unit passes there, and whether the engine is one the
collection supports (docs/field-evidence.md O9-O12)."""

from ansible_collections.dcu.serving.plugins.module_utils import container_engine


def container_run_flags(host):
    """The `docker run` options of every container unit on this host: --pull=never where the engine knows it
    (Docker 20.10 and later; older CLIs refuse it), and --security-opt=label=disable where SELinux is on -
    enforcing or permissive, which a reboot can turn into enforcing - so that the containers read the host paths
    they mount (the model, /opt/hyhal, the configuration), as Hygon's recipes run DCU containers."""
    host = host or {}
    flags = container_engine.run_flags((host.get("engine") or {}).get("version_tuple"))
    if host.get("selinux", "disabled") != "disabled":
        flags.append("--security-opt=label=disable")
    return flags


def container_engine_problem(host):
    """'' when the host's engine is one the collection supports; else what is wrong and the fix."""
    engine = (host or {}).get("engine") or {}
    name = engine.get("name") or "docker"
    if engine.get("present") is False:
        return "{} is not installed ({}): the containers need it; {}".format(
            name, engine.get("error") or "not found", container_engine.UPGRADE)
    if not engine.get("version"):
        return "{name} did not say its version: {why} (is the daemon running? systemctl status {name})".format(
            name=name, why=engine.get("error") or "no answer")
    return container_engine.problem(engine.get("raw") or engine["version"], name)
