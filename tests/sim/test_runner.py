"""How the instance was started decides what it serves (--task, --runner, --convert, config.json), and
--tensor-parallel-size: checked against the attention heads, one server over N cards, faster per token."""

from __future__ import annotations

import json
import subprocess

import pytest
from sim.simtools import DECODER, EMBEDDER, body, chat, metrics, model_dir, post

from support import free_port, python_module

DEPRECATED = "The 'task' option has been deprecated and will be removed in v0.13.0 or v1.0, whichever comes first."


def serves(server) -> set[str]:
    """Which of chat and embeddings the instance answers (an unserved API is a 400 envelope under HTTP 200)."""
    served = set()
    if "error" not in chat(server, {**body(max_tokens=1), "model": None}).json():
        served.add("chat")
    if "error" not in post(server, "/v1/embeddings", {"input": "x"}).json():
        served.add("embeddings")
    return served


def test_a_causal_lm_chats_unless_started_as_a_pooling_model(start_sim):
    assert serves(start_sim(served_model_name="qwen3", model_config=DECODER)) == {"chat"}
    new_way = start_sim("--runner", "pooling", "--convert", "embed", served_model_name="a", model_config=DECODER)
    assert serves(new_way) == {"embeddings"}
    assert DEPRECATED not in new_way.tail(100)
    old_way = start_sim("--task", "embed", served_model_name="b", model_config=DECODER)
    assert serves(old_way) == {"embeddings"}
    warnings = [line for line in old_way.tail(100).splitlines() if DEPRECATED in line]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING")
    assert warnings[0].endswith("Please replace this option with `--convert embed` to continue using this model as "
                                "a pooling model.")


def test_config_json_architecture_picks_the_runner(start_sim, tmp_path):
    assert serves(start_sim(served_model_name="bge-m3", model_config=EMBEDDER)) == {"embeddings"}
    # A Sentence Transformers directory (modules.json with a Pooling module) is a pooling model whatever its class.
    (tmp_path / "models/qwen3-embedding").mkdir(parents=True)
    (tmp_path / "models/qwen3-embedding/modules.json").write_text(json.dumps(
        [{"idx": 0, "type": "sentence_transformers.models.Transformer"},
         {"idx": 1, "type": "sentence_transformers.models.Pooling"}]))
    server = start_sim(served_model_name="qwen3-embedding", model_config=DECODER)
    assert serves(server) == {"embeddings"}
    assert "Resolved `--runner auto` to `--runner pooling`" in server.tail(100)


def start(tmp_path, config: dict, *args: str) -> subprocess.CompletedProcess:
    path = model_dir(tmp_path, "m", config)
    return subprocess.run(python_module("dcu_serving.sim", "serve", str(path), "--port", str(free_port()), *args),
                          capture_output=True, text=True, timeout=20)


def test_an_embedding_model_cannot_be_run_as_a_generator(tmp_path):
    refused = start(tmp_path, EMBEDDER, "--runner", "generate")
    assert refused.returncode == 1
    assert "Value error, This model does not support `--runner generate`." in refused.stderr
    assert "Starting vLLM API server" not in refused.stderr


@pytest.mark.parametrize("flag", ["--tensor-parallel-size", "-tp"])
def test_tensor_parallel_size_must_divide_the_attention_heads(tmp_path, flag):
    refused = start(tmp_path, {"architectures": ["Qwen2ForCausalLM"], "num_attention_heads": 28}, flag, "3")
    assert refused.returncode == 1
    assert "Total number of attention heads (28) must be divisible by tensor parallel size (3)." in refused.stderr
    assert "Starting vLLM API server" not in refused.stderr


def test_heads_are_read_from_the_text_config_of_a_multimodal_model(tmp_path):
    refused = start(tmp_path, {"architectures": ["MiniCPMV"], "text_config": {"num_attention_heads": 28}}, "-tp", "8")
    assert "Total number of attention heads (28) must be divisible by tensor parallel size (8)." in refused.stderr


def mean_itl(server) -> float:
    m = metrics(server)
    total = next(v for (name, _), v in m.items() if name == "vllm:inter_token_latency_seconds_sum")
    count = next(v for (name, _), v in m.items() if name == "vllm:inter_token_latency_seconds_count")
    return total / count


def test_two_cards_decode_faster_than_one_but_not_twice_as_fast(start_sim):
    timing = ("--sim-itl-ms", "20", "--sim-itl-jitter", "0", "--sim-think-tokens", "0", "--sim-answer-tokens", "40",
              "--sim-ttft-ms", "5")
    one = start_sim(*timing, served_model_name="tp1", model_config=DECODER)
    two = start_sim(*timing, "--tensor-parallel-size", "2", served_model_name="tp2", model_config=DECODER)
    for server, name in ((one, "tp1"), (two, "tp2")):
        assert chat(server, {**body(max_tokens=30), "model": name}, timeout=30).status_code == 200
    single, double = mean_itl(one), mean_itl(two)
    # Documented model: 20 ms / (2 x 0.85) + 2 ms all-reduce = 13.8 ms per token on two cards.
    assert single / 2 < double < single * 0.85, (single, double)
    # Still one server: one model card, one engine in the metrics.
    assert {labels for name, labels in metrics(two) if name == "vllm:num_requests_running"} == \
        {frozenset({("model_name", "tp2"), ("engine", "0")})}
