# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The vLLM instances of a host, worked out from its cards (dcu_facts) and the inventory: the one list that
dcu_vllm's units, dcu_proxy's backends, verify.yml and rolling_restart.yml derive from."""

import re

from ansible.errors import AnsibleFilterError

# Names an environment variable may have (POSIX portable set).
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def vllm_instances(cards, wanted=None, base_port=8002, client_host="127.0.0.1", cpulists=None, model="",
                   max_num_seqs=0, max_model_len=0, max_images=None, internal_port_base=20000,
                   internal_port_stride=100):
    """One instance per card: vllm@<index> on base_port + index, sorted by card.

    cards: ansible_facts.dcu.cards; wanted: the card indexes to serve (empty: all); cpulists: {NUMA node:
    'cpu list'} for pinning. Each instance: card, port, url, unit, container, pci_bus, card_node,
    render_node, numa_node, cpus, internal_port (vLLM's VLLM_PORT base, a range per instance), model,
    max_num_seqs, max_model_len, max_images.
    """
    cpulists = {int(k): v for k, v in (cpulists or {}).items()}
    wanted = [int(i) for i in wanted or []]
    chosen = [c for c in cards or [] if not wanted or c["index"] in wanted]
    instances = []
    for card in sorted(chosen, key=lambda c: c["index"]):
        port = int(base_port) + card["index"]
        if port > 65535:
            raise AnsibleFilterError("vllm_instances: base_port {} + card {} exceeds 65535".format(
                base_port, card["index"]))
        instances.append({
            "card": card["index"],
            "port": port,
            "url": "http://{}:{}".format(client_host, port),
            "unit": "vllm@{}".format(card["index"]),
            "container": "vllm-{}".format(card["index"]),
            "pci_bus": card.get("pci_bus"),
            "card_node": card.get("card_node"),
            "render_node": card.get("render_node"),
            "numa_node": card.get("numa_node"),
            "cpus": cpulists.get(card.get("numa_node"), "") if card.get("numa_node") is not None else "",
            "internal_port": int(internal_port_base) + card["index"] * int(internal_port_stride),
            "model": model,
            "max_num_seqs": int(max_num_seqs),
            "max_model_len": int(max_model_len),
            "max_images": max_images,
        })
    return instances


def env_file_problems(env):
    """What keeps `env` ({name: value}) from being written as a systemd EnvironmentFile, one line each."""
    problems = []
    for name, value in sorted((env or {}).items()):
        if not _ENV_NAME.match(str(name)):
            problems.append("{!r} is not an environment variable name".format(name))
        text = str(value)
        if any(char in text for char in "\n\r\\\"'"):
            problems.append("{}'s value must be plain text without quotes, backslashes or line breaks".format(name))
    return problems


def vllm_device_nodes(stat_lines):
    """The device nodes that exist, from `stat --format='%n %g %G' NODE...`: {path: {gid, group}}.

    stat prints a line for each node it finds and only an error (on stderr) for a missing one, so a node
    absent from the result is missing on the host.
    """
    nodes = {}
    for line in stat_lines or []:
        fields = line.split()
        if len(fields) < 3:
            raise AnsibleFilterError("vllm_device_nodes: expected 'path gid group', got {!r}".format(line))
        nodes[fields[0]] = {"gid": int(fields[1]), "group": fields[2]}
    return nodes


def vllm_run_options(instances, nodes, env=(), device_isolation="card", numa_pinning=False, container_options=()):
    """Each instance's `docker run` options: {card: [option, ...]}.

    instances: vllm_instances; nodes: vllm_device_nodes. Every container gets /dev/kfd (and /dev/mkfd where
    the host has it), the device nodes' groups by gid except root's (the image's user is not in the host's
    groups by name), and the names of its environment (env: a mapping or names; VLLM_PORT always), sorted
    without regard to case. device_isolation `card` passes only the instance's card and render node;
    `visible_devices` passes /dev/dri and HIP_VISIBLE_DEVICES. numa_pinning pins an instance to its NUMA
    node's CPUs and memory when its CPU list is known. container_options come last.
    """
    if device_isolation not in ("card", "visible_devices"):
        raise AnsibleFilterError("vllm_run_options: device_isolation must be card or visible_devices, got {!r}".format(
            device_isolation))
    gids = sorted({node["gid"] for node in nodes.values() if node["gid"] != 0})
    names = sorted(["VLLM_PORT", *env], key=lambda name: name.lower())
    shared = (["--device=/dev/kfd"] + (["--device=/dev/mkfd"] if "/dev/mkfd" in nodes else [])
              + ["--group-add={}".format(gid) for gid in gids]
              + ["--env={}".format(name) for name in names])
    options = {}
    for instance in instances:
        if device_isolation == "card":
            devices = ["--device={}".format(instance["card_node"]), "--device={}".format(instance["render_node"])]
        else:
            devices = ["--device=/dev/dri", "--env=HIP_VISIBLE_DEVICES"]
        numa = []
        if numa_pinning and instance.get("cpus"):
            numa = ["--cpuset-cpus={}".format(instance["cpus"]), "--cpuset-mems={}".format(instance["numa_node"])]
        options[instance["card"]] = devices + shared + numa + list(container_options or [])
    return options


class FilterModule(object):
    def filters(self):
        return {
            "vllm_instances": vllm_instances,
            "vllm_device_nodes": vllm_device_nodes,
            "vllm_run_options": vllm_run_options,
            "env_file_problems": env_file_problems,
        }
