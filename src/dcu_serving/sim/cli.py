"""`dcu-vllm-sim serve MODEL_PATH [vLLM flags] [--sim-* flags]` (also `vllm serve ...` in the image).

It takes the same command line as `vllm serve`, so one unit file serves a real card and the
simulator: the flags it uses (--host, --port, --served-model-name, --max-num-seqs, --max-model-len,
--limit-mm-per-prompt, --reasoning-parser, --enable-server-load-tracking, --task, --runner, --convert,
--tensor-parallel-size, --tokenizer, --skip-tokenizer-init) are parsed, every other vLLM flag is
accepted and reported once as ignored. Simulation knobs come from --sim-* flags or the DCU_SIM_*
environment (an env file can change them without touching the vLLM command line).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from dcu_serving.sim import VLLM_VERSION, model, startup
from dcu_serving.sim.config import SimConfig
from dcu_serving.sim.faults import HELP as FAULT_HELP
from dcu_serving.sim.faults import FaultError, parse_fault_list
from dcu_serving.sim.model import StartupError

log = logging.getLogger("dcu_serving.sim")

# vLLM flags that take no value. Any other flag the simulator does not know is taken to have a value
# when the next word is not a flag; `--no-*` flags are switches too.
VLLM_SWITCHES = frozenset({
    "--trust-remote-code", "--enable-prefix-caching", "--disable-custom-all-reduce", "--enforce-eager",
    "--disable-log-requests", "--enable-log-requests", "--disable-log-stats", "--enable-chunked-prefill",
    "--enable-auto-tool-choice", "--disable-frontend-multiprocessing", "--disable-fastapi-docs",
    "--enable-prompt-tokens-details", "--enable-force-include-usage", "--enable-request-id-headers",
    "--disable-uvicorn-access-log", "--enable-lora", "--async-scheduling",
    "--enable-sleep-mode", "--headless", "--enable-expert-parallel", "--disable-sliding-window",
    "--disable-cascade-attn", "--enable-log-outputs", "--use-v2-block-manager", "--disable-async-output-proc",
})


def _env(name: str, default, kind):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
        raise SystemExit(f"dcu-vllm-sim: environment {name}={raw!r} is not valid: {e}") from None


def _at_least(minimum, kind=float):
    def check(text):
        value = kind(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value
    check.__name__ = kind.__name__
    return check


def _image_limit(text: str) -> int:
    """vLLM accepts '{"image": 9}' (0.11) and the older 'image=9'."""
    try:
        limits = json.loads(text)
    except json.JSONDecodeError:
        limits = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
    if not isinstance(limits, dict) or "image" not in limits:
        raise argparse.ArgumentTypeError(f'expected JSON like \'{{"image": 9}}\', got {text!r}')
    try:
        count = int(limits["image"])
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"image limit must be an integer, got {limits['image']!r}") from None
    if count < 0:
        raise argparse.ArgumentTypeError("image limit must not be negative")
    return count


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _faults(text: str):
    try:
        return parse_fault_list(text)
    except FaultError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The top-level parser and its `serve` subcommand."""
    defaults = SimConfig(model_path=Path("."), served_model_names=[])
    p = argparse.ArgumentParser(
        prog="dcu-vllm-sim", allow_abbrev=False,
        description="A vLLM-compatible OpenAI server that stands in for a DCU card (no model is run).",
    )
    p.add_argument("--version", action="version", version=VLLM_VERSION)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", allow_abbrev=False, help="serve the OpenAI API like `vllm serve`")
    s.add_argument("model_tag", nargs="?", help="model directory (must hold a config.json, as for vLLM)")
    s.add_argument("--model", help="same as MODEL_TAG")
    s.add_argument("--host", default=None, help="address to listen on (default: all)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--served-model-name", nargs="+", default=None,
                   help="model name(s) the API accepts (default: the model path)")
    s.add_argument("--max-num-seqs", type=_at_least(1, int), default=defaults.max_num_seqs,
                   help="sequences generated at once; later requests wait in a FIFO queue")
    s.add_argument("--max-model-len", type=_at_least(16, int), default=None,
                   help="context length (default: max_position_embeddings from config.json, else 32768)")
    s.add_argument("--limit-mm-per-prompt", type=_image_limit, default=None, dest="image_limit",
                   help='e.g. \'{"image": 9}\'')
    s.add_argument("--reasoning-parser", default=None,
                   help="any value: thinking goes to reasoning_content instead of <think> in content")
    s.add_argument("--enable-server-load-tracking", action="store_true",
                   help="count in-flight requests in GET /load")
    s.add_argument("--task", choices=model.TASK_CHOICES, default=None,
                   help="deprecated in vLLM 0.11 (a warning says what replaces it): embed, score, ...")
    s.add_argument("--runner", choices=("auto", "generate", "pooling", "draft"), default="auto",
                   help="generate (chat, completions, transcriptions) or pooling (embeddings, rerank, score); "
                        "auto: from config.json architectures")
    s.add_argument("--convert", choices=("auto", "none", *model.POOLING_CONVERTS), default="auto",
                   help="adapt the model into a pooling model (embed, classify, reward)")
    s.add_argument("--tensor-parallel-size", "-tp", type=_at_least(1, int), default=1,
                   help="cards one instance spans (attention heads must divide evenly); one server either way")
    s.add_argument("--omni", action="store_true",
                   help="vLLM-Omni: serve the model's audio output (text to speech, /v1/audio/speech)")
    s.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory)")
    s.add_argument("--skip-tokenizer-init", action="store_true", help="load no tokenizer")

    g = s.add_argument_group("simulation (each also from the environment variable shown)")

    def knob(flag, env, kind, default, text):
        g.add_argument(flag, type=kind, default=_env(env, default, kind), help=f"{text} [{env}, default {default}]")

    knob("--sim-ttft-ms", "DCU_SIM_TTFT_MS", _at_least(0), defaults.ttft_ms,
         "base time to first token; prompt tokens and images add to it")
    knob("--sim-itl-ms", "DCU_SIM_ITL_MS", _at_least(0), defaults.itl_ms, "inter-token latency")
    knob("--sim-itl-jitter", "DCU_SIM_ITL_JITTER", _at_least(0), defaults.itl_jitter,
         "relative jitter of each inter-token gap (0.1 = ±10%%)")
    knob("--sim-prefill-tokens-per-s", "DCU_SIM_PREFILL_TOKENS_PER_S", _at_least(1), defaults.prefill_tokens_per_s,
         "prompt processing speed (adds prompt_tokens / speed to the time to first token)")
    knob("--sim-image-ms", "DCU_SIM_IMAGE_MS", _at_least(0), defaults.image_ms,
         "vision encoder time per image, added to the time to first token")
    knob("--sim-think-tokens", "DCU_SIM_THINK_TOKENS", _at_least(0, int), defaults.think_tokens,
         "typical length of the <think> block (±15%% per request)")
    knob("--sim-answer-tokens", "DCU_SIM_ANSWER_TOKENS", _at_least(1, int), defaults.answer_tokens,
         "typical length of the answer (±30%% per request)")
    knob("--sim-load-seconds", "DCU_SIM_LOAD_SECONDS", _at_least(0), defaults.load_seconds,
         "simulated model load before listening (connections are refused meanwhile)")
    knob("--sim-seed", "DCU_SIM_SEED", int, defaults.seed, "seed of the generated text")
    g.add_argument("--sim-embedding-dim", type=_at_least(1, int), default=_env("DCU_SIM_EMBEDDING_DIM", None, int),
                   help="embedding size [DCU_SIM_EMBEDDING_DIM, default: hidden_size in config.json, else 1024]")
    knob("--sim-tp-efficiency", "DCU_SIM_TP_EFFICIENCY", _fraction, defaults.tp_efficiency,
         "with -tp N, the cards compute N x this as fast as one")
    knob("--sim-tp-allreduce-ms", "DCU_SIM_TP_ALLREDUCE_MS", _at_least(0), defaults.tp_allreduce_ms,
         "with -tp N > 1, added to every decoded token (the all-reduce between the cards)")
    g.add_argument("--sim-fault", type=_faults, action="append", default=None,
                   help=f"inject a fault from the start (repeatable, or comma-separated): {FAULT_HELP} "
                        "[DCU_SIM_FAULT]")
    return p, s


def _is_flag(word: str) -> bool:
    if not word.startswith("-") or word == "-":
        return False
    try:
        float(word)  # a negative number is a value, not a flag
        return False
    except ValueError:
        return True


def split_ignored(known: set[str], argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate the vLLM flags the simulator has no use for from those it parses (`known`)."""
    kept, ignored = [], []
    i = 0
    while i < len(argv):
        word = argv[i]
        name = word.split("=", 1)[0]
        if not _is_flag(word) or name in known or word == "--":
            kept.append(word)
            i += 1
            continue
        takes_value = "=" not in word and name not in VLLM_SWITCHES and not name.startswith("--no-")
        has_value = takes_value and i + 1 < len(argv) and not _is_flag(argv[i + 1])
        ignored.extend(argv[i:i + 1 + has_value])
        i += 1 + has_value
    return kept, ignored


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The command line (errors exit 2, as argparse does) and the vLLM flags the simulator ignores."""
    parser, serve = build_parser()
    known = {opt for p in (parser, serve) for action in p._actions for opt in action.option_strings}
    kept, ignored = split_ignored(known, argv)
    args = parser.parse_args(kept)
    args.model = args.model or args.model_tag
    if not args.model:
        serve.error("serve needs the model directory: dcu-vllm-sim serve MODEL_PATH ...")
    if args.model_tag and args.model != args.model_tag:
        serve.error(f"two different models given: {args.model_tag} and --model {args.model}")
    faults = args.sim_fault if args.sim_fault is not None else [_env("DCU_SIM_FAULT", [], _faults)]
    args.sim_fault = [f for group in faults for f in group]
    return args, ignored


def build_config(args: argparse.Namespace) -> SimConfig:
    """Read the model directory and resolve what the instance serves, like vLLM's ModelConfig (may refuse)."""
    path = Path(args.model)
    model_config = model.load_model_dir(path)
    resolved = model.resolve(path, model_config, args.task, args.runner, args.convert)
    model.check_tensor_parallel(model_config, args.tensor_parallel_size)
    matryoshka, matryoshka_dims = model.matryoshka(model_config)
    hidden = model.text_config(model_config).get("hidden_size")
    return SimConfig(
        model_path=path,
        served_model_names=args.served_model_name or [args.model],
        host=args.host, port=args.port,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len or model.derived_max_len(model_config) or 32768,
        image_limit=999 if args.image_limit is None else args.image_limit,
        reasoning_parser=args.reasoning_parser,
        enable_server_load_tracking=args.enable_server_load_tracking,
        architecture=resolved.architecture, runner=resolved.runner, convert=resolved.convert,
        # vLLM-Omni (`--omni`) serves a TTS model's audio: the speech API instead of text generation.
        tasks=frozenset({"speech"}) if args.omni and resolved.runner == "generate" else resolved.tasks,
        encoder_only=resolved.encoder_only,
        embedding_dim=args.sim_embedding_dim or (hidden if isinstance(hidden, int) and hidden > 0 else 1024),
        matryoshka=matryoshka, matryoshka_dimensions=matryoshka_dims,
        tensor_parallel_size=args.tensor_parallel_size,
        max_audio_mb=_env("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB", 25, int),
        ttft_ms=args.sim_ttft_ms, itl_ms=args.sim_itl_ms, itl_jitter=args.sim_itl_jitter,
        prefill_tokens_per_s=args.sim_prefill_tokens_per_s, image_ms=args.sim_image_ms,
        think_tokens=args.sim_think_tokens, answer_tokens=args.sim_answer_tokens,
        load_seconds=args.sim_load_seconds, seed=args.sim_seed,
        tp_efficiency=args.sim_tp_efficiency, tp_allreduce_ms=args.sim_tp_allreduce_ms, faults=args.sim_fault,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format="%(levelname)s %(asctime)s [dcu-vllm-sim] %(message)s", datefmt="%m-%d %H:%M:%S",
    )
    args, ignored = parse_args(sys.argv[1:] if argv is None else argv)
    log.info("vLLM API server version %s (simulated by dcu-vllm-sim)", VLLM_VERSION)
    if ignored:
        log.warning("ignoring vLLM flags the simulator has no use for: %s", " ".join(ignored))
    # As PID 1 in a container a signal without a handler is ignored: stop promptly even while loading.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        config = build_config(args)
        log.info("model %s (%s) served as %s: runner=%s tasks=%s max_model_len=%d max_num_seqs=%d "
                 "tensor_parallel_size=%d image_limit=%d", config.model_path, config.architecture or "?",
                 ", ".join(config.served_model_names), config.runner, ",".join(sorted(config.tasks)),
                 config.max_model_len, config.max_num_seqs, config.tensor_parallel_size, config.image_limit)
        # In vLLM's order: the tokenizer (hub lookups), then the engine: devices, internal port, weights.
        startup.check_offline(config.model_path, args.tokenizer and Path(args.tokenizer), args.skip_tokenizer_init)
        startup.log_usage_stats()
        startup.check_devices()
        internal_port = startup.get_open_port(startup.vllm_port())
        if config.load_seconds:
            # Like vLLM: nothing listens until the weights are loaded (clients see connection refused).
            log.info("loading model weights (simulated, %.1fs)", config.load_seconds)
            time.sleep(config.load_seconds)
        internal = startup.bind_internal_port(internal_port)
    except StartupError as e:
        for line in e.lines:
            log.error("%s", line)
        return 1
    log.info("torch.distributed TCPStore bound on port %d (VLLM_PORT=%s)", internal_port,
             os.environ.get("VLLM_PORT", "unset"))

    from dcu_serving.sim.server import serve  # imported late: argument errors stay fast

    serve(config)
    internal.close()
    return 0
