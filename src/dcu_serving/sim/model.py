"""What the model directory says the instance is, resolved the way vLLM 0.11's ModelConfig does it.

vLLM reads `architectures` from config.json and picks a runner (generate | pooling) and a conversion
(none | embed | classify | reward) from the architecture's name, or from --runner / --convert, or from
the deprecated --task. The supported tasks decide which endpoints answer: chat and completions for
"generate", /v1/audio/transcriptions for "transcription", /v1/embeddings for "embed", /rerank and
/score for "embed" (cosine of embeddings) or "score" (a cross-encoder).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("dcu_serving.sim")

# vLLM 0.11 config/model.py _SUFFIX_TO_DEFAULTS: the first suffix an architecture ends with wins.
SUFFIX_TO_DEFAULTS: list[tuple[str, tuple[str, str]]] = [
    ("ForCausalLM", ("generate", "none")),
    ("ForConditionalGeneration", ("generate", "none")),
    ("ChatModel", ("generate", "none")),
    ("LMHeadModel", ("generate", "none")),
    ("ForTextEncoding", ("pooling", "embed")),
    ("EmbeddingModel", ("pooling", "embed")),
    ("ForSequenceClassification", ("pooling", "classify")),
    ("ForAudioClassification", ("pooling", "classify")),
    ("ForImageClassification", ("pooling", "classify")),
    ("ForVideoClassification", ("pooling", "classify")),
    ("ClassificationModel", ("pooling", "classify")),
    ("ForRewardModeling", ("pooling", "reward")),
    ("RewardModel", ("pooling", "reward")),
    ("Model", ("pooling", "embed")),  # let other `*Model`s take priority
]
# Models vLLM registers as transcription only (supports_transcription_only): no chat, no completions.
TRANSCRIPTION_ONLY = frozenset({"WhisperForConditionalGeneration"})
GENERATE_TASKS = ("generate", "transcription")
POOLING_TASKS = ("embedding", "embed", "classify", "score", "reward")
TASK_CHOICES = ("auto", *GENERATE_TASKS, *POOLING_TASKS, "draft")
POOLING_CONVERTS = ("embed", "classify", "reward")
# Files a tokenizer is loaded from (any one of them is enough for the simulator's check).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model")
# vLLM's possible keys for the model's context length (the smallest one present wins).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_sequence_length", "max_seq_length", "seq_len", "max_target_positions")


class StartupError(Exception):
    """vLLM refuses to start: the lines it prints (the last one is the exception), exit status 1."""

    def __init__(self, *lines: str):
        super().__init__(lines[-1])
        self.lines = lines


def config_error(config_class: str, message: str) -> StartupError:
    """vLLM 0.11's configs are pydantic dataclasses: a ValueError in their checks comes out wrapped like this."""
    return StartupError(f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {config_class}",
                        f"  Value error, {message} [type=value_error]")


def load_model_dir(path: Path) -> dict:
    """Like vLLM: the model must be a directory with a readable config.json."""
    config = path / "config.json"
    if not path.is_dir():
        raise SystemExit(f"dcu-vllm-sim: model path {path} is not a directory; vLLM needs the model "
                         "directory there (with its config.json): fix MODEL_PATH or the volume mount")
    try:
        data = json.loads(config.read_text())
    except FileNotFoundError:
        raise SystemExit(f"dcu-vllm-sim: {config} does not exist; vLLM cannot load a model directory "
                         "without config.json") from None
    except (OSError, ValueError) as e:
        raise SystemExit(f"dcu-vllm-sim: cannot read {config}: {e}") from None
    if not isinstance(data, dict):
        raise SystemExit(f"dcu-vllm-sim: {config} must hold a JSON object")
    return data


def text_config(model_config: dict) -> dict:
    """The language model's section (vLLM's hf_text_config): text_config / llm_config, else the top level."""
    for key in ("text_config", "llm_config"):
        section = model_config.get(key)
        if isinstance(section, dict):
            return section
    return model_config


def derived_max_len(model_config: dict) -> int | None:
    values = [v for section in (model_config, text_config(model_config)) for key in MAX_LEN_KEYS
              if isinstance(v := section.get(key), int) and v > 0]
    return min(values) if values else None


def has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def _suffix_defaults(arch: str, runner: str | None = None) -> tuple[str, str] | None:
    for suffix, (default_runner, convert) in SUFFIX_TO_DEFAULTS:
        if (runner is None or runner == default_runner) and arch.endswith(suffix):
            return default_runner, convert
    return None


def _sentence_transformers_pooling(path: Path) -> bool:
    """vLLM's get_pooling_config: a modules.json with a Pooling module makes any architecture a pooling model."""
    try:
        modules = json.loads((path / "modules.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(modules, list) and any(
        isinstance(m, dict) and "Pooling" in str(m.get("type", "")) for m in modules)


@dataclass
class Resolved:
    architecture: str
    runner: str
    convert: str
    tasks: frozenset[str]
    encoder_only: bool


def resolve(path: Path, model_config: dict, task: str | None, runner: str, convert: str) -> Resolved:
    """vLLM 0.11 ModelConfig.__post_init__: --task (deprecated) -> runner/convert -> supported tasks."""
    archs = model_config.get("architectures") or []
    arch = archs[0] if archs and isinstance(archs[0], str) else ""
    defaults = _suffix_defaults(arch)
    is_pooling = defaults is not None and defaults[0] == "pooling"
    is_generative = not is_pooling

    if task is not None:
        prefix = ("The 'task' option has been deprecated and will be removed in v0.13.0 or v1.0, whichever "
                  "comes first.")
        hint = "Please remove this option."
        if task in GENERATE_TASKS:
            runner, convert, hint = "generate", "auto", "Please remove this option"  # vLLM's hint has no full stop
        elif task in POOLING_TASKS:
            runner, convert = "pooling", _task_to_convert(task, arch)
            hint = (f"Please replace this option with `--convert {convert}` to continue using this model as a "
                    "pooling model.")
        log.warning("%s %s", prefix, hint)

    if runner == "auto":
        runner = _default_runner(path, arch)
        if runner != "generate":
            log.info("Resolved `--runner auto` to `--runner %s`. Pass the value explicitly to silence this "
                     "message.", runner)
    if convert == "auto":
        convert = _default_convert(arch, runner, is_generative, is_pooling)
        if convert != "none":
            log.info("Resolved `--convert auto` to `--convert %s`. Pass the value explicitly to silence this "
                     "message.", convert)

    if runner == "generate" and not is_generative:
        raise config_error("ModelConfig", "This model does not support `--runner generate`.")
    if runner == "pooling" and not is_pooling and convert not in POOLING_CONVERTS:
        raise config_error("ModelConfig", "This model does not support `--runner pooling`. You can pass "
                           f"`--convert <{'|'.join(POOLING_CONVERTS)}> to adapt it into a pooling model.")

    if runner == "generate":
        tasks = {"transcription"} if arch in TRANSCRIPTION_ONLY else {"generate"}
    else:
        extra = _default_pooling_task(arch) if convert == "none" else convert
        tasks = {"encode", extra} | ({"score"} if extra == "classify" else set())
    decoder = _suffix_defaults(arch, "generate") is not None
    return Resolved(arch, runner, convert, frozenset(tasks), encoder_only=runner == "pooling" and not decoder)


def _default_runner(path: Path, arch: str) -> str:
    if _sentence_transformers_pooling(path):  # some Sentence Transformers models use *ForCausalLM archs
        return "pooling"
    defaults = _suffix_defaults(arch)
    return defaults[0] if defaults else "generate"


def _default_convert(arch: str, runner: str, is_generative: bool, is_pooling: bool) -> str:
    if (runner == "generate" and is_generative) or (runner == "pooling" and is_pooling):
        return "none"
    defaults = _suffix_defaults(arch, runner)
    if defaults:
        return defaults[1]
    return "embed" if runner == "pooling" else "none"


def _default_pooling_task(arch: str) -> str:
    defaults = _suffix_defaults(arch, "pooling")
    return defaults[1] if defaults else "embed"


def _task_to_convert(task: str, arch: str) -> str:
    if task in ("embedding", "embed"):
        return "embed"
    if task == "score":
        return "classify" if _default_pooling_task(arch) == "classify" else "embed"
    return task  # classify, reward


def check_tensor_parallel(model_config: dict, size: int):
    """ModelConfig.verify_with_parallel_config: attention heads are split evenly over the cards."""
    heads = text_config(model_config).get("num_attention_heads", 0)
    if isinstance(heads, int) and heads % size != 0:
        # 0.11 validates VllmConfig as a pydantic dataclass, which wraps the ValueError it raises.
        raise config_error("VllmConfig", f"Total number of attention heads ({heads}) must be divisible by "
                                         f"tensor parallel size ({size}).")


def matryoshka(model_config: dict) -> tuple[bool, list[int] | None]:
    """vLLM: `dimensions` is allowed when config.json says is_matryoshka or lists matryoshka_dimensions."""
    dims = model_config.get("matryoshka_dimensions")
    dims = [d for d in dims if isinstance(d, int)] if isinstance(dims, list) else None
    return bool(model_config.get("is_matryoshka")) or dims is not None, dims
