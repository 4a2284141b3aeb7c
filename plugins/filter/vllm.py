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


class FilterModule(object):
    def filters(self):
        return {"vllm_instances": vllm_instances, "env_file_problems": env_file_problems}
