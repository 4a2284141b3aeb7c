"""The instances a host runs and the settings its env files may hold (plugins/filter/vllm.py)."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.filter.vllm import env_file_problems, vllm_instances

CARDS = [{"index": i, "pci_bus": f"0000:{b}:00.0", "card_node": f"/dev/dri/card{i}",
          "render_node": f"/dev/dri/renderD{128 + i}", "numa_node": 0 if i < 4 else 1}
         for i, b in enumerate(["05", "2b", "14", "1a", "86", "b8", "c0", "9e"])]


def test_one_instance_per_card_on_its_port_with_its_own_internal_port_range():
    instances = vllm_instances(CARDS, cpulists={0: "0-31", "1": "32-63"}, model="MiniCPM-V-4.5", max_num_seqs=4)
    assert [i["unit"] for i in instances] == [f"vllm@{n}" for n in range(8)]
    assert [i["port"] for i in instances] == list(range(8002, 8010))
    assert [i["internal_port"] for i in instances] == [20000 + 100 * n for n in range(8)]
    assert instances[1]["pci_bus"] == "0000:2b:00.0" and instances[1]["render_node"] == "/dev/dri/renderD129"
    assert instances[5]["cpus"] == "32-63", "pinned to its card's NUMA node's CPUs"


def test_only_the_wanted_cards_and_ports_that_exist():
    assert [i["card"] for i in vllm_instances(CARDS, wanted=[6, 2])] == [2, 6]
    with pytest.raises(AnsibleFilterError, match="exceeds 65535"):
        vllm_instances(CARDS, base_port=65530)


def test_env_file_values_systemd_can_read():
    assert env_file_problems({"HF_HUB_OFFLINE": "1", "VLLM_HCU_USE_CUSTOM_OPS": 0}) == []
    problems = env_file_problems({"BAD-NAME": "1", "QUOTED": 'say "hi"', "MULTI": "a\nb", "SLASH": "a\\b"})
    assert problems == ["'BAD-NAME' is not an environment variable name",
                        "MULTI's value must be plain text without quotes, backslashes or line breaks",
                        "QUOTED's value must be plain text without quotes, backslashes or line breaks",
                        "SLASH's value must be plain text without quotes, backslashes or line breaks"]
