# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What a model directory says about the model's size in VRAM: the numbers in config.json that the KV cache
and tensor parallelism depend on, and the weight files vLLM would load (sizes from stat, never read).

Multimodal configs keep the language model in a sub-config (text_config: Llava, Qwen2.5-VL, Gemma 3;
llm_config: InternVL; language_config: DeepSeek-VL2) or at the top level next to vision_config (MiniCPM-V,
whose config class subclasses Qwen3Config): a sub-config's values win, the top level fills in, and a
vision_config is never read. Encoder-decoder models (Whisper) count their decoder.
Runs on the managed host: Python 3.6+, standard library only.
"""

import json
import os
import re

# Where multimodal configs keep the language model, in the order looked at.
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config", "thinker_config")

# Model types whose attention is encoder-only (bidirectional): vLLM keeps no KV cache for them.
ENCODER_ONLY_TYPES = frozenset(["bert", "roberta", "xlm-roberta", "xlm_roberta", "camembert", "distilbert",
                                "electra", "deberta", "deberta-v2", "nomic_bert", "modernbert", "new", "gte"])

# Files vLLM skips even when they match a weight pattern (weight_utils.filter_files_not_needed_for_inference).
NOT_WEIGHTS = frozenset(["training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt"])

# vLLM loads the first format present: safetensors, else PyTorch .bin (.pt only when asked for).
WEIGHT_FORMATS = (("safetensors", (".safetensors",)), ("bin", (".bin",)), ("pt", (".pt", ".pth")))
INDEX_FILES = {"safetensors": "model.safetensors.index.json", "bin": "pytorch_model.bin.index.json"}
# Another precision of the same weights (model.fp32-00001-of-00002.safetensors next to model.safetensors).
_VARIANT = re.compile(r"^(?:model|pytorch_model)\.[A-Za-z0-9_]+(?:-\d+-of-\d+)?\.(?:safetensors|bin)$")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "merges.txt", "sentencepiece.bpe.model", "spiece.model", "qwen.tiktoken")

_FIELDS = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
    "hidden_size": ("hidden_size", "d_model", "n_embd"),
    "head_dim": ("head_dim",),
    "torch_dtype": ("torch_dtype", "dtype"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
}
# Encoder-decoder configs name the decoder's numbers apart (Whisper, BART, T5).
_DECODER_FIELDS = {
    "num_hidden_layers": ("decoder_layers", "num_decoder_layers"),
    "num_attention_heads": ("decoder_attention_heads", "num_heads"),
    "max_position_embeddings": ("max_target_positions",),
}


class ModelInfoError(Exception):
    """The directory holds no readable config.json; the message names the path and the fix."""


def _first(configs, names):
    for config in configs:
        for name in names:
            value = config.get(name)
            if value is not None and not isinstance(value, bool):
                return value
    return None


def text_config(config):
    """(key, sub-config) of the language model, or (None, config) when it sits at the top level."""
    for key in TEXT_CONFIG_KEYS:
        sub = config.get(key)
        if isinstance(sub, dict) and key == "thinker_config" and isinstance(sub.get("text_config"), dict):
            return key + ".text_config", sub["text_config"]
        if isinstance(sub, dict) and any(name in sub for name in _FIELDS["num_hidden_layers"]
                                         + _FIELDS["num_attention_heads"]):
            return key, sub
    return None, config


def config_numbers(config):
    """The numbers the budget needs from a parsed config.json, and the names it lacks."""
    key, sub = text_config(config)
    configs = [sub, config] if key else [config]
    encoder_decoder = bool(config.get("is_encoder_decoder"))
    info = {"text_config_key": key, "is_encoder_decoder": encoder_decoder}
    for field, names in _FIELDS.items():
        if encoder_decoder and field in _DECODER_FIELDS:
            names = _DECODER_FIELDS[field] + names
        info[field] = _first(configs, names)
    for field in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
                  "max_position_embeddings", "kv_lora_rank", "qk_rope_head_dim"):
        if info[field] is not None:
            try:
                info[field] = int(info[field])
            except (TypeError, ValueError):
                info[field] = None
    if info["num_key_value_heads"] is None:
        info["num_key_value_heads"] = info["num_attention_heads"]
    if info["head_dim"] is None and info["hidden_size"] and info["num_attention_heads"]:
        info["head_dim"] = info["hidden_size"] // info["num_attention_heads"]
    if isinstance(info["torch_dtype"], str):
        info["torch_dtype"] = info["torch_dtype"].replace("torch.", "")
    else:
        info["torch_dtype"] = None
    model_type = sub.get("model_type") if key else None
    info["model_type"] = config.get("model_type")
    info["text_model_type"] = model_type or config.get("model_type")
    info["encoder_only"] = not encoder_decoder and str(info["text_model_type"]).lower() in ENCODER_ONLY_TYPES
    info["encoder_positions"] = config.get("max_source_positions") if encoder_decoder else None
    architectures = config.get("architectures")
    info["architectures"] = [str(a) for a in architectures] if isinstance(architectures, list) else []
    quantization = config.get("quantization_config") or sub.get("quantization_config")
    info["quantization_config"] = quantization if isinstance(quantization, dict) else None
    info["quantization"] = (quantization.get("quant_method") if isinstance(quantization, dict) else None) or None
    info["max_model_len_limit"] = _derived_max_len(info["max_position_embeddings"],
                                                   sub.get("rope_scaling") or config.get("rope_scaling"))
    info["missing"] = [field for field in ("num_hidden_layers", "num_attention_heads", "hidden_size", "torch_dtype",
                                           "max_position_embeddings") if info[field] is None]
    return info


def _derived_max_len(max_position_embeddings, rope_scaling):
    """The longest max_model_len vLLM accepts without VLLM_ALLOW_LONG_MAX_MODEL_LEN: max_position_embeddings,
    times the RoPE scaling factor where vLLM applies it (yarn from original_max_position_embeddings; not for
    su/longrope/llama3/mrope/default, which already state their length)."""
    if not max_position_embeddings or not isinstance(rope_scaling, dict):
        return max_position_embeddings
    kind = rope_scaling.get("rope_type") or rope_scaling.get("type")
    factor = rope_scaling.get("factor")
    if kind in (None, "su", "longrope", "llama3", "mrope", "default") or not isinstance(factor, (int, float)):
        return max_position_embeddings
    base = max_position_embeddings
    if kind == "yarn" and rope_scaling.get("original_max_position_embeddings"):
        base = int(rope_scaling["original_max_position_embeddings"])
    return int(base * factor)


def _index_names(path, fmt):
    """The files the format's index maps weights to (None when there is no index)."""
    index = os.path.join(path, INDEX_FILES.get(fmt, ""))
    if fmt not in INDEX_FILES or not os.path.isfile(index):
        return None
    try:
        with open(index) as handle:
            weight_map = json.load(handle).get("weight_map")
    except (IOError, OSError, ValueError, AttributeError):
        return None
    return set(weight_map.values()) if isinstance(weight_map, dict) else None


def weight_files(path):
    """(format, files vLLM would load, files it would not): each file {name, size}, top level only."""
    entries = {}
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.endswith((".safetensors", ".bin", ".pt", ".pth")) and os.path.isfile(full):
            entries[name] = os.stat(full).st_size
    chosen, used, ignored = None, [], []
    for fmt, suffixes in WEIGHT_FORMATS:
        names = [n for n in entries if n.endswith(suffixes) and n not in NOT_WEIGHTS]
        if names and chosen is None:
            chosen = fmt
            indexed = _index_names(path, fmt)
            plain = [n for n in names if not _VARIANT.match(n)]
            for name in names:
                if indexed is not None and name not in indexed:
                    ignored.append({"name": name, "size": entries[name], "reason": "not in " + INDEX_FILES[fmt]})
                elif plain and _VARIANT.match(name):
                    ignored.append({"name": name, "size": entries[name],
                                    "reason": "another variant of the weights (the plain model files are loaded)"})
                else:
                    used.append({"name": name, "size": entries[name]})
    for name, size in sorted(entries.items()):
        if not any(f["name"] == name for f in used + ignored):
            reason = "not a weight file" if name in NOT_WEIGHTS else "{} files are loaded instead".format(chosen)
            ignored.append({"name": name, "size": size, "reason": reason})
    ignored.sort(key=lambda f: f["name"])
    return chosen, used, ignored


def read_model_info(path):
    """Everything the budget needs from the model directory at `path`; ModelInfoError when config.json is
    missing or not a JSON object."""
    if not os.path.exists(path):
        raise ModelInfoError("{} does not exist: copy the model directory (config.json, tokenizer, weights) "
                             "there first".format(path))
    if not os.path.isdir(path):
        raise ModelInfoError("{} is not a directory: point model_dir at the directory that holds "
                             "config.json".format(path))
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ModelInfoError("{} has no config.json: it is not a Hugging Face model directory (copy the whole "
                             "directory, not only the weights)".format(path))
    try:
        with open(config_file, "rb") as handle:
            config = json.loads(handle.read().decode("utf-8"))
    except ValueError as error:
        raise ModelInfoError("{} is not valid JSON ({}): copy it again from the model's source".format(
            config_file, error)) from None
    except (IOError, OSError) as error:
        raise ModelInfoError("{} cannot be read: {}".format(config_file, error)) from None
    if not isinstance(config, dict):
        raise ModelInfoError("{} holds a JSON {} instead of an object: copy it again from the model's "
                             "source".format(config_file, type(config).__name__))
    info = config_numbers(config)
    fmt, used, ignored = weight_files(path)
    info.update({
        "path": path,
        "config_file": config_file,
        "weight_format": fmt,
        "weight_files": used,
        "ignored_files": ignored,
        "weights_bytes": sum(f["size"] for f in used),
        "tokenizer_files": [name for name in TOKENIZER_FILES if os.path.isfile(os.path.join(path, name))],
    })
    info["tokenizer"] = bool(info["tokenizer_files"])
    return info
