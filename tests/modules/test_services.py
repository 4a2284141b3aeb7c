"""A host carved into model services (plugins/plugin_utils/services.py): the instances, their `vllm serve`
arguments, and every refusal before anything starts - each naming the service and the fix."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from modules.services_host import CARDS, DEFAULTS, SERVICES, by_name, services

from ansible_collections.dcu.serving.plugins.plugin_utils.services import (
    vllm_kernel_advice,
    vllm_service_problems,
    vllm_services,
)


def test_the_platform_layout():
    instances = vllm_services(SERVICES, CARDS, DEFAULTS)
    assert [(i["name"], i["unit"], i["cards"], i["tensor_parallel"], i["port"], i["internal_port"])
            for i in instances] == [
        ("chat-0", "vllm@chat-0", [0, 1], 2, 8002, 20000),
        ("vision-0", "vllm@vision-0", [2], 1, 8004, 20200),
        ("vision-1", "vllm@vision-1", [3], 1, 8005, 20300),
        ("vision-2", "vllm@vision-2", [4], 1, 8006, 20400),
        ("vision-3", "vllm@vision-3", [5], 1, 8007, 20500),
        ("embed-0", "vllm@embed-0", [6], 1, 8008, 20600),
        ("rerank-0", "vllm@rerank-0", [7], 1, 8009, 20700),
    ]
    chat = instances[0]
    assert chat["container"] == "vllm-chat-0" and chat["url"] == "http://127.0.0.1:8002"
    assert chat["model"] == "Qwen2.5-14B-Instruct" and chat["models"] == ["Qwen2.5-14B-Instruct", "qwen-chat"]
    assert chat["render_nodes"] == ["/dev/dri/renderD128", "/dev/dri/renderD129"]
    assert chat["card_nodes"] == ["/dev/dri/card1", "/dev/dri/card2"]
    assert chat["pci_buses"] == ["0000:05:00.0", "0000:2b:00.0"]
    assert chat["numa_node"] == 0 and chat["visible_devices"] == "0,1" and chat["interconnect"] == "pcie"
    # TP=2 over PCIe (K100_AI): RCCL's LL protocol hangs without fine-grained PCIe memory (field evidence K2).
    assert chat["env"] == {**DEFAULTS["env"], "HSA_FORCE_FINE_GRAIN_PCIE": "1"}
    assert chat["start_grace"] == 900 and chat["runtime"] == "image"
    assert instances[4]["numa_node"] == 1


def test_serve_arguments_per_kind():
    instances = by_name(vllm_services(SERVICES, CARDS, DEFAULTS))
    assert instances["chat-0"]["serve_args"] == [
        "--served-model-name", "Qwen2.5-14B-Instruct", "qwen-chat", "--max-num-seqs", "8", "--max-model-len", "32768",
        "--gpu-memory-utilization", "0.9", "--tensor-parallel-size", "2", "--disable-custom-all-reduce",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert instances["vision-2"]["serve_args"] == [
        "--served-model-name", "MiniCPM-V-4.5", "--max-num-seqs", "4", "--max-model-len", "32768",
        "--gpu-memory-utilization", "0.9", "--limit-mm-per-prompt", '{"image":9}', "--trust-remote-code"]
    assert instances["embed-0"]["serve_args"] == [
        "--served-model-name", "bge-m3", "--max-num-seqs", "64", "--max-model-len", "8192",
        "--gpu-memory-utilization", "0.5", "--runner", "pooling"]
    assert instances["rerank-0"]["serve_args"][-2:] == ["--runner", "pooling"]
    assert instances["vision-0"]["max_images"] == 9 and instances["embed-0"]["max_images"] is None


def test_optional_flags_only_when_set():
    chosen = services(chat={"dtype": "bfloat16", "quantization": "awq", "kv_cache_dtype": "fp8",
                            "chat_template": "/models/templates/qwen.jinja", "extra_args": ["--enable-prefix-caching"],
                            "limit_mm_per_prompt": {"image": 2, "video": 0}},
                      embed={"task": "embed", "runner": None}, rerank={"convert": "classify"})
    instances = by_name(vllm_services(chosen, CARDS, DEFAULTS))
    args = instances["chat-0"]["serve_args"]
    assert args[args.index("--limit-mm-per-prompt") + 1] == '{"image":2,"video":0}'
    assert args[args.index("--dtype"):] == [
        "--dtype", "bfloat16", "--tensor-parallel-size", "2", "--disable-custom-all-reduce", "--quantization", "awq",
        "--kv-cache-dtype", "fp8", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template",
        "/models/templates/qwen.jinja", "--enable-prefix-caching"]
    assert instances["embed-0"]["serve_args"][-2:] == ["--task", "embed"]  # vLLM < 0.10.1 images
    assert instances["rerank-0"]["serve_args"][-4:] == ["--runner", "pooling", "--convert", "classify"]
    quantization_none = by_name(vllm_services(services(chat={"quantization": "none"}), CARDS, DEFAULTS))
    assert "--quantization" not in quantization_none["chat-0"]["serve_args"]


def test_transcription_gets_nothing_chat_specific():
    layout = [{"name": "asr", "kind": "transcription", "models": ["whisper-large-v3"],
               "model_dir": "/models/whisper-large-v3", "cards": [3], "max_model_len": 448}]
    (asr,) = vllm_services(layout, CARDS, DEFAULTS)
    assert asr["serve_args"] == ["--served-model-name", "whisper-large-v3", "--max-num-seqs", "4", "--max-model-len",
                                 "448", "--gpu-memory-utilization", "0.9"]
    layout[0].update(tool_call_parser="hermes", limit_mm_per_prompt={"audio": 1})
    assert vllm_service_problems(layout, CARDS, DEFAULTS) == [
        "service asr: limit_mm_per_prompt is for chat and vision models, not transcription",
        "service asr: tool_call_parser is for chat and vision models, not transcription"]


def test_the_default_layout_keeps_todays_names_ports_and_arguments():
    """dcu_vllm today: one instance per card, vllm@<card>, port 8002 + card, VLLM_PORT 20000 + 100 x card, the
    same `vllm serve` arguments (roles/dcu_vllm/vars/main.yml __dcu_vllm_serve_args with the role's defaults)."""
    legacy = [{"name": "", "kind": "vision", "models": ["MiniCPM-V-4.5"], "model_dir": "/models/MiniCPM-V-4_5",
               "cards": [c["index"] for c in CARDS], "replicas": len(CARDS)}]
    defaults = dict(DEFAULTS, trust_remote_code=True, cpulists={0: "0-31", 1: "32-63"})
    instances = vllm_services(legacy, CARDS, defaults)
    assert [i["name"] for i in instances] == [str(n) for n in range(8)]
    assert [i["unit"] for i in instances] == [f"vllm@{n}" for n in range(8)]
    assert [i["container"] for i in instances] == [f"vllm-{n}" for n in range(8)]
    assert [i["port"] for i in instances] == list(range(8002, 8010))
    assert [i["url"] for i in instances] == [f"http://127.0.0.1:{8002 + n}" for n in range(8)]
    assert [i["internal_port"] for i in instances] == [20000 + 100 * n for n in range(8)]
    assert [i["cpus"] for i in instances] == ["0-31"] * 4 + ["32-63"] * 4
    assert {i["max_images"] for i in instances} == {9}
    assert {tuple(i["serve_args"]) for i in instances} == {(
        "--served-model-name", "MiniCPM-V-4.5", "--max-num-seqs", "4", "--max-model-len", "32768",
        "--gpu-memory-utilization", "0.9", "--limit-mm-per-prompt", '{"image":9}', "--trust-remote-code")}
    assert vllm_service_problems(legacy + SERVICES[:1], CARDS, defaults)[0].startswith(
        "the default service (name '') is today's one-model layout and cannot be mixed with named services")


def test_a_card_given_to_two_services_names_both():
    problems = vllm_service_problems(services(chat={"cards": [0, 1, 2, 3]}, vision={"cards": [2, 3, 4, 5]}),
                                     CARDS, DEFAULTS)
    assert problems == [
        "card 2 is given to service chat and service vision: a card serves one service; remove it from all but one",
        "card 3 is given to service chat and service vision: a card serves one service; remove it from all but one"]


def test_a_card_the_host_does_not_have_lists_the_hosts_cards():
    problems = vllm_service_problems(services(rerank={"cards": [8, 9]}), CARDS, DEFAULTS)
    assert problems == ["service rerank: card 8, 9 are not on this host, which has cards 0, 1, 2, 3, 4, 5, 6, 7: "
                        "choose from those"]


def test_cards_that_do_not_split_into_replicas():
    problems = vllm_service_problems(services(vision={"replicas": 3}), CARDS, DEFAULTS)
    assert problems == ["service vision: 4 cards do not split into 3 replicas (tensor parallel = cards / replicas): "
                        "use replicas 1, 2, 4 or give it a multiple of 3 cards"]


def test_a_tensor_parallel_group_across_numa_nodes():
    chosen = services(vision={"cards": [2, 5], "replicas": 1}, chat={"cards": [0, 1, 3, 4], "replicas": 1})
    problems = vllm_service_problems(chosen, CARDS, DEFAULTS)
    assert problems == [
        "service chat: instance chat-0 would span NUMA nodes 0 and 1 (cards 0, 1, 3, 4): tensor parallel across "
        "nodes crosses the CPU interconnect; give it cards of one node (node 0: cards 0, 1, 3; node 1: cards 4) "
        "or set allow_cross_numa: true",
        "service vision: instance vision-0 would span NUMA nodes 0 and 1 (cards 2, 5): tensor parallel across "
        "nodes crosses the CPU interconnect; give it cards of one node (node 0: cards 2; node 1: cards 5) or set "
        "allow_cross_numa: true"]
    chosen[0]["allow_cross_numa"] = True
    chosen[1]["allow_cross_numa"] = True
    instances = by_name(vllm_services(chosen, CARDS, dict(DEFAULTS, cpulists={0: "0-31", 1: "32-63"})))
    assert instances["chat-0"]["numa_nodes"] == [0, 1] and instances["chat-0"]["numa_node"] is None
    assert instances["chat-0"]["cpus"] == "0-31,32-63"
    # Old kernels report no NUMA node (-1): nothing to refuse.
    unknown = [dict(card, numa_node=-1) for card in CARDS]
    assert vllm_service_problems(services(chat={"cards": [0, 1, 3, 4]}, vision={"cards": [2, 5], "replicas": 1}),
                                 unknown, DEFAULTS) == []


@pytest.mark.parametrize("series, disabled", [
    ("K100_AI", True), ("K100-AI", True), ("Z100L", True), ("BW100", True), ("BW150", True),
    ("BW1100", False), ("BW1000", False),
    ("BW", True), (None, True),  # unknown: the stable choice
])
def test_custom_all_reduce_is_disabled_over_pcie(series, disabled):
    cards = [dict(card, series=series) for card in CARDS]
    (chat,) = [i for i in vllm_services(SERVICES, cards, DEFAULTS) if i["name"] == "chat-0"]
    assert chat["disable_custom_all_reduce"] is disabled
    assert ("--disable-custom-all-reduce" in chat["serve_args"]) is disabled
    # PCIe (or unknown) links: RCCL gets fine-grained PCIe memory too (HSA_FORCE_FINE_GRAIN_PCIE, K2); HLink not.
    assert (chat["env"].get("HSA_FORCE_FINE_GRAIN_PCIE") == "1") is disabled


def test_a_service_s_own_fine_grain_setting_wins_and_one_card_gets_none():
    chosen = services(chat={"env": {"HSA_FORCE_FINE_GRAIN_PCIE": "0"}})
    instances = by_name(vllm_services(chosen, CARDS, DEFAULTS))
    assert instances["chat-0"]["env"]["HSA_FORCE_FINE_GRAIN_PCIE"] == "0"
    assert "HSA_FORCE_FINE_GRAIN_PCIE" not in instances["vision-0"]["env"]


def test_custom_all_reduce_override_and_never_at_one_card():
    instances = by_name(vllm_services(services(chat={"disable_custom_all_reduce": False}), CARDS, DEFAULTS))
    assert "--disable-custom-all-reduce" not in instances["chat-0"]["serve_args"]
    assert not instances["vision-0"]["disable_custom_all_reduce"]


def test_names_kinds_and_models_are_checked():
    chosen = services(chat={"name": "Chat Bot"}, vision={"kind": "image"}, embed={"name": "rerank"},
                      rerank={"models": ["bge-m3", "my reranker"]})
    problems = vllm_service_problems(chosen, CARDS, DEFAULTS)
    assert problems == [
        "service Chat Bot: the name must be one word of a-z, 0-9 and '-', at most 40 characters, not starting or "
        "ending with '-' (it names units vllm@<name>-<n> and containers), got 'Chat Bot'",
        "service vision: kind 'image' is not one of chat, vision, embedding, rerank, transcription, speech",
        "service rerank (#4): another service has this name: rename one",
        "service rerank (#4): served model names are one word each (clients send them as `model`), got "
        "'my reranker'",
        "model name bge-m3 is served by service rerank and service rerank (#4): the proxy routes each name to one "
        "service; rename it in all but one (models)"]


def test_a_model_name_served_twice_names_both_services():
    problems = vllm_service_problems(services(rerank={"models": ["bge-m3"]}), CARDS, DEFAULTS)
    assert problems == ["model name bge-m3 is served by service embed and service rerank: the proxy routes each "
                        "name to one service; rename it in all but one (models)"]


def test_ports_outside_the_range_and_overlapping_internal_ports():
    problems = vllm_service_problems(SERVICES, CARDS, dict(DEFAULTS, base_port=65529))
    assert problems == [
        "service rerank: instance rerank-0 would listen on port 65536, outside 1-65535: lower base_port"]
    problems = vllm_service_problems(SERVICES, CARDS, dict(DEFAULTS, internal_port_base=8000, internal_port_stride=10))
    assert problems[0] == ("service chat: instance chat-0's internal ports 8000-8009 (VLLM_PORT) hold port 8002 of "
                           "instance chat-0: move internal_port_base away from base_port")
    problems = vllm_service_problems(SERVICES, CARDS, dict(DEFAULTS, internal_port_base=65000))
    assert "service rerank: instance rerank-0's internal ports 65700-65799 (VLLM_PORT) leave 1-65535" in problems[-1]


def test_settings_are_checked_per_service():
    chosen = services(chat={"gpu_memory_utilization": 1.5, "max_num_seqs": 0, "model_dir": "models/qwen"},
                      vision={"runtime": "docker", "env": {"BAD-NAME": "1"}},
                      embed={"task": "embed", "runner": "pooling"}, rerank={"extra_args": "--enable-prefix-caching"})
    assert vllm_service_problems(chosen, CARDS, DEFAULTS) == [
        "service chat: model_dir must be an absolute path without spaces (the model directory on the host), "
        "got 'models/qwen'",
        "service chat: max_num_seqs must be at least 1, got 0",
        "service chat: gpu_memory_utilization is the fraction of each card's VRAM vLLM may use, above 0 and at "
        "most 1 (e.g. 0.9), got 1.5",
        "service vision: runtime 'docker' is not image (the image's own DTK with the host's hyhal mounted, Hygon's "
        "recipe), host (the host's hyhal and DTK mounted) or bundled (the image carries its own runtime)",
        "service vision: env: 'BAD-NAME' is not an environment variable name",
        "service embed: task is the older spelling of runner/convert (vLLM < 0.10.1); set one or the other",
        "service rerank: extra_args must be a list of arguments, one per item, got '--enable-prefix-caching'"]


def test_the_filter_refuses_with_every_problem_at_once():
    with pytest.raises(AnsibleFilterError) as error:
        vllm_services(services(chat={"cards": [0, 1, 2]}, rerank={"cards": [9]}), CARDS, DEFAULTS)
    message = str(error.value)
    assert message.startswith("vllm_services: the services cannot run on this host:\n- ")
    assert "card 9 is not on this host" in message and "card 2 is given to service chat and service vision" in message
    assert vllm_service_problems([], CARDS, DEFAULTS) == [
        "no service to run: list at least one (name, kind, models, model_dir, cards)"]


def test_tensor_parallel_over_pcie_is_warned_about_the_kernel_it_lacks():
    instances = vllm_services(SERVICES, CARDS, DEFAULTS)  # chat: TP=2 over K100_AI (PCIe)
    advice = vllm_kernel_advice(instances, "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet", "1\n")
    assert [line.split(", and ")[1].split(".")[0] for line in advice] == [
        "the kernel command line has no iommu=pt: RCCL's peer-to-peer traffic between PCIe cards goes through the "
        "IOMMU", "NUMA auto balancing is on: RCCL warns and throughput fluctuates"]
    assert all(line.startswith("vllm@chat-0 run tensor parallel over PCIe") and "Fix: " in line for line in advice)
    assert vllm_kernel_advice(instances, "ro quiet iommu=pt", "0\n") == []
    hlink = vllm_services(SERVICES, [dict(card, series="BW1100") for card in CARDS], DEFAULTS)
    assert vllm_kernel_advice(hlink, "ro quiet", "1") == [], "OAM modules on HLink need neither"


def test_each_served_model_has_its_services_kind_for_the_gateway():
    from ansible_collections.dcu.serving.plugins.plugin_utils.services import served_model_kinds

    services = [{"name": "chat", "kind": "chat", "models": ["Qwen3-32B", "qwen"]},
                {"name": "tts", "kind": "speech", "models": "CosyVoice3-0.5B"},
                {"name": "asr", "kind": "transcription", "models": ["whisper-large-v3"]},
                {"name": "old", "models": ["m"]}]
    assert served_model_kinds(services, "ignored") == {"Qwen3-32B": "chat", "qwen": "chat",
                                                       "CosyVoice3-0.5B": "speech",
                                                       "whisper-large-v3": "transcription", "m": "chat"}
    assert served_model_kinds([], "MiniCPM-V-4.5") == {"MiniCPM-V-4.5": "vision"}  # the default layout
