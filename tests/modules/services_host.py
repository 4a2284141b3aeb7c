"""A realistic 8-card host carved into model services, and the model directories its services serve.

Cards: 8 x K100_AI (PCIe, 64 GB: hy-smi reports "vram Total Memory (MiB)": "65520"), NUMA node 0 for cards
0-3 and 1 for 4-7, the PCI buses of the 8-card host in docs/field-evidence.md.

Model configs (tests/modules/samples/models/*.json) carry the published numbers:
- qwen2.5-14b-instruct: Qwen/Qwen2.5-14B-Instruct's config.json (48 layers, 40 heads, 8 KV heads, hidden 5120,
  32768 positions, bf16; the same numbers appear in public copies of it found with the search tool).
- minicpm-v-4.5: openbmb/MiniCPM-V-4_5's shape - MiniCPMVConfig subclasses Qwen3Config (public copy of its
  configuration file), so Qwen3-8B's numbers sit at the top level (36 layers, 32 heads, 8 KV heads,
  head_dim 128, 40960 positions, bf16) next to the SigLIP2 vision_config (27 layers, 16 heads).
- bge-m3 / bge-reranker-v2-m3: BAAI's XLMRobertaModel / XLMRobertaForSequenceClassification (24 layers,
  16 heads, hidden 1024, 8194 positions, float32 on disk).
- whisper-large-v3: openai/whisper-large-v3 (32+32 layers, 20 heads, d_model 1280, 448 target and 1500 source
  positions, 128 mel bins, float16).
- internvl3-8b (llm_config) and qwen2.5-vl-7b-text-config (text_config, newer transformers' "dtype"): the
  language model in a sub-config; Qwen2.5-7B's numbers.
Weight sizes are the published totals (parameters x bytes: 14.77 B x 2 for Qwen2.5-14B, about 8.7 B x 2 for
MiniCPM-V 4.5, 568 M x 4 for the bge models, 1.55 B x 2 for Whisper); how a total splits into shards is
illustrative. The files are sparse (os.truncate): a "30 GB" model costs nothing.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import yaml

SAMPLES = Path(__file__).parent / "samples" / "models"

BUSES = ["05", "2b", "14", "1a", "86", "b8", "c0", "9e"]
CARDS = [{"index": i, "pci_bus": f"0000:{bus}:00.0", "device_id": "0x6210", "series": "K100_AI",
          "numa_node": 0 if i < 4 else 1, "vram_total_mib": 65520, "driver": "hycu",
          "card_node": f"/dev/dri/card{i + 1}", "render_node": f"/dev/dri/renderD{128 + i}"}
         for i, bus in enumerate(BUSES)]

DEFAULTS = {
    "base_port": 8002, "client_host": "127.0.0.1", "internal_port_base": 20000, "internal_port_stride": 100,
    "image": "harbor.sourcefind.cn:5443/dcu/admin/base/vllm:0.11.0-ubuntu22.04-dtk26.04-py3.10",
    "runtime": "image", "max_model_len": 32768, "max_num_seqs": 4, "gpu_memory_utilization": 0.9,
    "limit_mm_per_prompt": {"image": 9}, "trust_remote_code": False, "start_grace": 900,
    "env": {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"},
}

# chat TP=2 on cards 0-1, vision on 2-5 with 4 replicas, embeddings on 6, reranker on 7.
SERVICES = [
    {"name": "chat", "kind": "chat", "models": ["Qwen2.5-14B-Instruct", "qwen-chat"],
     "model_dir": "/models/Qwen2.5-14B-Instruct", "cards": [0, 1], "max_num_seqs": 8, "tool_call_parser": "hermes"},
    {"name": "vision", "kind": "vision", "models": ["MiniCPM-V-4.5"], "model_dir": "/models/MiniCPM-V-4_5",
     "cards": [2, 3, 4, 5], "replicas": 4, "trust_remote_code": True},
    {"name": "embed", "kind": "embedding", "models": ["bge-m3"], "model_dir": "/models/bge-m3", "cards": [6],
     "max_model_len": 8192, "max_num_seqs": 64, "gpu_memory_utilization": 0.5},
    {"name": "rerank", "kind": "rerank", "models": ["bge-reranker-v2-m3"], "model_dir": "/models/bge-reranker-v2-m3",
     "cards": [7], "max_model_len": 8192, "max_num_seqs": 64, "gpu_memory_utilization": 0.5},
]

# Each model's files (config, weight sizes, index, other files): the catalog tools/stand-in-model.yml uses too.
MODELS = yaml.safe_load((Path(__file__).resolve().parents[2] / "tools" / "stand-in-models.yml").read_text())


def config(name: str) -> dict:
    return json.loads((SAMPLES / f"{name}.json").read_text())


def sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb"):
        pass
    os.truncate(path, size)


def make_model_dir(root: Path, name: str, config_name: str | None = None) -> Path:
    """A model directory as Hugging Face ships it: config.json, tokenizer files, sparse weight files."""
    layout = MODELS.get(name, {})
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text((SAMPLES / (config_name or layout["config"])).read_text())
    for file, size in {**layout.get("weights", {}), **layout.get("subdir", {})}.items():
        sparse(path / file, size)
    for file in layout.get("other", []):
        (path / file).write_text("{}")
    if layout.get("index"):
        weight_map = {f"model.layers.{n}.weight": file for n, file in enumerate(layout["weights"])}
        (path / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": sum(layout["weights"].values())}, "weight_map": weight_map}))
    return path


def services(**changes):
    """SERVICES with per-service changes: services(chat={"cards": [0, 1, 2]})."""
    result = copy.deepcopy(SERVICES)
    for service in result:
        service.update(changes.get(service["name"], {}))
    return result


def by_name(instances):
    return {i["name"]: i for i in instances}
