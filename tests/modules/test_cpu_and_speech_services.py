"""Two additions to the services carving (plugins/plugin_utils/services.py): a service placed on the CPU (no card,
device or DCU environment; moved back to its cards by one value), and speech synthesis as a kind (vLLM-Omni)."""

from __future__ import annotations

import copy

from modules.services_host import CARDS, DEFAULTS, SERVICES, make_model_dir

from ansible_collections.dcu.serving.plugins.module_utils.model_config import read_model_info
from ansible_collections.dcu.serving.plugins.plugin_utils.containers import (
    vllm_device_nodes,
    vllm_image_problems,
    vllm_run_options,
)
from ansible_collections.dcu.serving.plugins.plugin_utils.services import vllm_service_problems, vllm_services
from ansible_collections.dcu.serving.plugins.plugin_utils.vram import vllm_vram_budget

STAT = ["/dev/kfd 992 render", "/dev/dri/card1 44 video", "/dev/dri/renderD128 992 render",
        "/dev/dri/card2 44 video", "/dev/dri/renderD129 992 render"]


def layout(**changes):
    chosen = copy.deepcopy(SERVICES)
    for service in chosen:
        service.update(changes.get(service["name"], {}))
    return chosen


def by_name(instances):
    return {i["name"]: i for i in instances}


def test_an_embedding_service_on_the_cpu_takes_no_card_and_its_own_ports():
    instances = by_name(vllm_services(layout(embed={"placement": "cpu", "max_num_seqs": 16}), CARDS, DEFAULTS))
    embed = instances["embed-0"]
    assert (embed["cards"], embed["card"], embed["placement"], embed["runtime"]) == ([], None, "cpu", "bundled")
    assert (embed["port"], embed["internal_port"], embed["url"]) == (8066, 26400, "http://127.0.0.1:8066")
    assert embed["serve_args"] == ["--served-model-name", "bge-m3", "--max-num-seqs", "16", "--max-model-len", "8192",
                                   "--runner", "pooling"], "no --gpu-memory-utilization on the CPU"
    assert embed["env"]["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert list(instances)[-1] == "embed-0", "CPU instances come after the card-placed ones"
    assert "rerank-0" in instances and instances["rerank-0"]["cards"] == [7]


def test_moving_it_to_a_card_is_one_value():
    on_cpu = by_name(vllm_services(layout(embed={"placement": "cpu"}), CARDS, DEFAULTS))["embed-0"]
    on_card = by_name(vllm_services(layout(embed={"placement": "dcu"}), CARDS, DEFAULTS))["embed-0"]
    assert (on_cpu["cards"], on_card["cards"]) == ([], [6])
    assert on_card["port"] == 8008 and "--gpu-memory-utilization" in on_card["serve_args"]


def test_the_cpu_instance_gets_no_dcu_device_group_or_runtime():
    instances = vllm_services(layout(embed={"placement": "cpu", "cpu_limit": 6}), CARDS, DEFAULTS)
    options = vllm_run_options(instances, vllm_device_nodes(STAT), hyhal_dir="/opt/hyhal", dtk_dir="/opt/dtk")
    cpu = options["embed-0"]
    assert not [o for o in cpu if o.startswith(("--device", "--group-add")) or "hyhal" in o or "dtk" in o], cpu
    assert "--cpus=6" in cpu and "--volume=/models/bge-m3:/models/bge-m3:ro" in cpu
    assert "--device=/dev/kfd" in options["rerank-0"], "the card-placed services keep their devices"


def test_the_vram_budget_lists_it_as_using_no_vram(tmp_path):
    dirs = {"/models/Qwen2.5-14B-Instruct": "qwen2.5-14b-instruct", "/models/MiniCPM-V-4_5": "minicpm-v-4.5",
            "/models/bge-m3": "bge-m3", "/models/bge-reranker-v2-m3": "bge-reranker-v2-m3"}
    infos = {path: read_model_info(str(make_model_dir(tmp_path, name))) for path, name in dirs.items()}
    budget = vllm_vram_budget(vllm_services(layout(embed={"placement": "cpu"}), CARDS, DEFAULTS), infos, CARDS)
    assert budget["fits"]
    assert [r["card"] for r in budget["rows"] if r["instance"] == "embed-0"] == ["cpu"]
    assert "on CPU, no VRAM" in budget["table"]
    assert 6 not in [r["card"] for r in budget["rows"]], "card 6 is free for another service"


def test_its_card_can_go_to_another_service_while_it_is_on_the_cpu_and_not_back_then():
    chosen = layout(embed={"placement": "cpu"}, rerank={"cards": [6, 7], "replicas": 2})
    assert vllm_service_problems(chosen, CARDS, DEFAULTS) == []
    back = layout(embed={"placement": "dcu"}, rerank={"cards": [6, 7], "replicas": 2})
    assert "card 6 is given to service embed and service rerank" in " ".join(vllm_service_problems(back, CARDS,
                                                                                                   DEFAULTS))


def test_bad_cpu_settings_name_the_fix():
    problems = vllm_service_problems(layout(embed={"placement": "gpu"}, rerank={"placement": "cpu", "cpu_limit": 0,
                                                                                "runtime": "host"}), CARDS, DEFAULTS)
    assert problems == [
        "service embed: placement 'gpu' is not dcu (its cards) or cpu (no card: the host's processors, a CPU build "
        "of vLLM)",
        "service rerank: cpu_limit is the processors the instance may use (docker --cpus), e.g. 8, got 0.0",
        "service rerank: runtime host mounts the host's DCU runtime, which a CPU instance does not use: leave "
        "runtime out"]


def test_no_dtk_check_for_a_cpu_image():
    instances = vllm_services(layout(embed={"placement": "cpu", "image": "vllm-cpu:0.11"}), CARDS, DEFAULTS)
    images = {"vllm-cpu:0.11": {"runtime": "host", "dtk": "24.04"}}
    assert [p for p in vllm_image_problems(instances, images, "6.3.30-V1.4.1a", "26.04") if "vllm-cpu" in p] == []


def test_speech_synthesis_is_served_by_vllm_omni():
    tts = [{"name": "tts", "kind": "speech", "models": ["CosyVoice3-0.5B"], "model_dir": "/models/CosyVoice3",
            "cards": [3], "trust_remote_code": True}]
    (instance,) = vllm_services(tts, CARDS, DEFAULTS)
    assert instance["kind"] == "speech" and instance["port"] == 8005
    assert instance["serve_args"] == ["--served-model-name", "CosyVoice3-0.5B", "--max-num-seqs", "4",
                                      "--max-model-len", "32768", "--gpu-memory-utilization", "0.9",
                                      "--trust-remote-code", "--omni"]
