"""What a model directory says about the model's size in VRAM (plugins/modules/model_info.py,
plugins/module_utils/model_config.py): real configs, sparse weight files (tests/modules/services_host.py)."""

from __future__ import annotations

import pytest
from modules.services_host import MODELS, make_model_dir

from ansible_collections.dcu.serving.plugins.module_utils.model_config import ModelInfoError, read_model_info


def test_a_chat_model_with_sharded_safetensors(tmp_path):
    info = read_model_info(str(make_model_dir(tmp_path, "qwen2.5-14b-instruct")))
    assert {k: info[k] for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                                 "hidden_size", "torch_dtype", "max_position_embeddings")} == {
        "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_size": 5120, "torch_dtype": "bfloat16", "max_position_embeddings": 32768}
    assert info["architectures"] == ["Qwen2ForCausalLM"] and info["text_config_key"] is None
    assert info["weight_format"] == "safetensors" and len(info["weight_files"]) == 8
    assert info["weights_bytes"] == 29_540_067_328
    assert info["quantization_config"] is None and info["missing"] == []
    assert info["tokenizer"] and "tokenizer.json" in info["tokenizer_files"]
    assert not info["encoder_only"] and not info["is_encoder_decoder"]


def test_minicpm_v_keeps_its_language_model_at_the_top_next_to_the_vision_tower(tmp_path):
    info = read_model_info(str(make_model_dir(tmp_path, "minicpm-v-4.5")))
    assert info["text_config_key"] is None
    assert (info["num_hidden_layers"], info["num_attention_heads"], info["num_key_value_heads"],
            info["head_dim"]) == (36, 32, 8, 128), "Qwen3-8B's numbers, not SigLIP's 27 layers and 16 heads"
    assert info["max_position_embeddings"] == 40960 and info["weights_bytes"] == 17_418_000_000


@pytest.mark.parametrize("config_name, key, numbers", [
    ("internvl3-8b.json", "llm_config", (28, 28, 4, 128, 32768, "bfloat16")),
    ("qwen2.5-vl-7b-text-config.json", "text_config", (28, 28, 4, 128, 128000, "bfloat16")),  # top-level "dtype"
])
def test_a_language_model_in_a_sub_config(tmp_path, config_name, key, numbers):
    info = read_model_info(str(make_model_dir(tmp_path, "vl", config_name)))
    assert info["text_config_key"] == key
    assert (info["num_hidden_layers"], info["num_attention_heads"], info["num_key_value_heads"], info["head_dim"],
            info["max_position_embeddings"], info["torch_dtype"]) == numbers
    assert info["weight_format"] is None and info["weights_bytes"] == 0 and info["weight_files"] == []


def test_an_embedding_model_with_bin_weights_and_extra_heads(tmp_path):
    info = read_model_info(str(make_model_dir(tmp_path, "bge-m3")))
    assert info["encoder_only"] and info["num_key_value_heads"] == 16 and info["head_dim"] == 64
    assert info["torch_dtype"] == "float32" and info["max_position_embeddings"] == 8194
    assert info["weight_format"] == "bin"
    assert [f["name"] for f in info["weight_files"]] == ["pytorch_model.bin"]
    assert info["weights_bytes"] == 2_271_145_830
    assert {f["name"]: f["reason"] for f in info["ignored_files"]} == {
        "colbert_linear.pt": "bin files are loaded instead", "sparse_linear.pt": "bin files are loaded instead"}
    assert "sentencepiece.bpe.model" in info["tokenizer_files"]


def test_a_reranker(tmp_path):
    info = read_model_info(str(make_model_dir(tmp_path, "bge-reranker-v2-m3")))
    assert info["architectures"] == ["XLMRobertaForSequenceClassification"] and info["encoder_only"]
    assert info["weights_bytes"] == 2_271_071_852


def test_whisper_counts_its_decoder_and_loads_one_precision(tmp_path):
    info = read_model_info(str(make_model_dir(tmp_path, "whisper-large-v3")))
    assert info["is_encoder_decoder"] and not info["encoder_only"]
    assert (info["num_hidden_layers"], info["num_attention_heads"], info["head_dim"], info["hidden_size"]) == (
        32, 20, 64, 1280)
    assert info["max_position_embeddings"] == 448 and info["encoder_positions"] == 1500
    assert [f["name"] for f in info["weight_files"]] == ["model.safetensors"]
    assert info["weights_bytes"] == 3_087_130_976
    assert sorted(f["name"] for f in info["ignored_files"]) == ["model.fp32-00001-of-00002.safetensors",
                                                                 "model.fp32-00002-of-00002.safetensors"]


def test_only_the_shards_the_index_maps(tmp_path):
    path = make_model_dir(tmp_path, "qwen2.5-14b-instruct")
    (path / "consolidated.safetensors").write_bytes(b"")
    (path / "training_args.bin").write_bytes(b"")
    info = read_model_info(str(path))
    assert len(info["weight_files"]) == 8
    assert {f["name"]: f["reason"] for f in info["ignored_files"]} == {
        "consolidated.safetensors": "not in model.safetensors.index.json",
        "training_args.bin": "not a weight file"}


def test_quantization_is_reported(tmp_path):
    info = read_model_info(str(make_model_dir(tmp_path, "awq", "qwen2.5-14b-instruct-awq.json")))
    assert info["quantization"] == "awq" and info["quantization_config"]["bits"] == 4


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "does not exist: copy the model directory"),
    (lambda p: p.write_text("x"), "is not a directory"),
    (lambda p: p.mkdir(), "has no config.json: it is not a Hugging Face model directory"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text('{"num_hidden_layers": 2,')), "is not valid JSON"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text("[1, 2]")), "holds a JSON list instead of an object"),
])
def test_errors_name_the_path_and_the_fix(tmp_path, setup, message):
    path = tmp_path / "model"
    setup(path)
    with pytest.raises(ModelInfoError, match=message) as error:
        read_model_info(str(path))
    assert str(path) in str(error.value)


def test_the_module_as_ansible_runs_it(tmp_path, module_runner):
    path = make_model_dir(tmp_path, "qwen2.5-14b-instruct")
    result = module_runner("model_info", {"path": str(path) + "/", "_ansible_check_mode": True})
    assert not result.get("failed") and result["changed"] is False
    assert result["path"] == str(path) and result["weights_bytes"] == 29_540_067_328
    assert result["num_attention_heads"] == 40

    failed = module_runner("model_info", {"path": str(tmp_path / "missing")})
    assert failed["failed"] and failed["msg"].startswith("model_info: " + str(tmp_path / "missing"))


def test_sparse_fixtures_cost_nothing(tmp_path):
    path = make_model_dir(tmp_path, "qwen2.5-14b-instruct")
    used = sum(f.stat().st_blocks * 512 for f in path.iterdir())
    assert used < 1_000_000 and sum(MODELS["qwen2.5-14b-instruct"]["weights"].values()) > 29 * 10 ** 9
