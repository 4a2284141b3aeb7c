# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Before a vLLM instance starts: does its model go with its tensor parallel size and context length
(vllm_model_problems), and does it fit each of its cards (vllm_vram_budget)?

The budget per card, in GiB (1 GiB = 2^30 bytes):
  need = weights / TP
       + KV cache = 2 x layers x ceil(KV heads / TP) x head dim x KV dtype bytes x tokens x max_num_seqs
       + margin   = fixed_gib + weights_fraction x (weights / TP) [+ multimodal_gib for vision]
  have = card VRAM x gpu_memory_utilization
Why this shape: vLLM gives an instance gpu_memory_utilization x total VRAM and, at start, measures what is not
KV cache with a profiling forward pass - weights, the peak activations of a batch of max_num_batched_tokens
(and, for multimodal models, the vision encoder on the largest inputs limit_mm_per_prompt allows), and
non-torch memory (the HIP runtime, RCCL buffers); the rest becomes KV cache (vllm/v1/worker/gpu_worker.py,
determine_available_memory). HIP graph capture comes after the profile and is not in it. The margin stands for
all of that: a fixed part (runtime, communication buffers, graphs), a part that grows with the model (its
activations scale with its width, which its weights stand for), and a part for image inputs. Defaults 1.0 GiB,
5 %, 1.0 GiB; a parameter, because only a real start measures it.
The KV cache is sized for every sequence at full length: max_num_seqs requests of max_model_len tokens at once,
the load the proxy sends. vLLM itself only refuses to start when one max_model_len sequence does not fit
(kv_cache_utils._check_enough_kv_cache_memory); above that it queues and preempts. Rows say both: `fits`
(full load) and `starts`. Details: KV heads per card are max(1, KV heads / TP), which ceil() equals for every
valid TP; vLLM pages in blocks of 16 tokens (ignored, < 0.1 %); encoder-only models (BERT, XLM-RoBERTa) keep no
KV cache; an encoder-decoder model (Whisper) also holds cross-attention KV for its encoder positions; MLA models
(DeepSeek) one latent of kv_lora_rank + qk_rope_head_dim per layer and token. dtype: --dtype, else the model's;
a float32 checkpoint is loaded in 16 bits (vLLM's "auto" downcasts it), so its weights count half their file
size; --kv-cache-dtype fp8* is 1 byte.
"""

import math

GIB = float(1 << 30)
DEFAULT_MARGIN = {"fixed_gib": 1.0, "weights_fraction": 0.05, "multimodal_gib": 1.0}
DTYPE_BYTES = {"float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "float32": 4, "float": 4, "fp32": 4}
# vLLM's defaults when the service leaves them unset (vllm/engine/arg_utils.py; 0.10-0.11).
VLLM_GPU_MEMORY_UTILIZATION = 0.9
VLLM_MAX_NUM_SEQS = 256  # API server on devices under 70 GiB; 1024 above
# The highest gpu_memory_utilization advice proposes: the rest is the driver's and the runtime's.
MAX_ADVISED_UTILIZATION = 0.95


def _path(text):
    return str(text or "").rstrip("/") or "/"


def _infos(model_infos):
    """{model_dir: info} from a dict, a list of model_info results, or a registered loop's results."""
    if isinstance(model_infos, dict) and "results" in model_infos:
        model_infos = model_infos["results"]
    found = {}
    if isinstance(model_infos, dict):
        for path, info in model_infos.items():
            found[_path(path)] = info
        return found
    for info in model_infos or []:
        if not isinstance(info, dict):
            continue
        path = info.get("path") or (info.get("invocation") or {}).get("module_args", {}).get("path") \
            or info.get("item")
        if isinstance(path, str):
            found[_path(path)] = info
    return found


def _label(instance):
    return _row_label(instance.get("service"), instance.get("name"))


def _row_label(service, name):
    return "{}, instance {}".format("the default service" if service == "" else "service {}".format(service), name)


def _info_problem(instance, infos):
    """(info, None), or (None, why there is none)."""
    info = infos.get(_path(instance.get("model_dir")))
    if info is None:
        return None, "no model_info for {}: run dcu.serving.model_info on it first".format(instance.get("model_dir"))
    if info.get("failed"):
        return None, info.get("msg") or "model_info failed for {}".format(instance.get("model_dir"))
    return info, None


def _tp_choices(heads, kv_heads, upto):
    return [tp for tp in range(1, upto + 1) if heads % tp == 0 and _kv_divides(kv_heads, tp)]


def _kv_divides(kv_heads, tp):
    return not kv_heads or (kv_heads % tp == 0 if kv_heads >= tp else tp % kv_heads == 0)


def vllm_model_problems(instances, model_infos, card_count=8):
    """What vLLM would refuse at start, from each model's config.json: tensor parallel vs attention heads (with
    vLLM's own message), vs KV heads, and a max_model_len above what the model supports. One line each."""
    infos = _infos(model_infos)
    problems = []
    seen = set()
    for instance in instances:
        info, problem = _info_problem(instance, infos)
        key = (instance.get("service"), instance.get("tensor_parallel"), instance.get("max_model_len"))
        if problem or key in seen:
            problem = problem and "{}: {}".format(_label(instance), problem)
            if problem and problem not in problems:
                problems.append(problem)
            continue
        seen.add(key)
        label = _label(instance)
        tp = int(instance.get("tensor_parallel") or 1)
        heads = info.get("num_attention_heads")
        kv_heads = info.get("num_key_value_heads")
        choices = ", ".join(str(t) for t in _tp_choices(heads or 0, kv_heads, card_count)) if heads else ""
        if heads and heads % tp:
            problems.append("{label}: Total number of attention heads ({heads}) must be divisible by tensor "
                            "parallel size ({tp}). Fix: give each replica a number of cards that divides {heads} "
                            "({choices})".format(
                                label=label, heads=heads, tp=tp, choices=choices))
        elif kv_heads and not _kv_divides(kv_heads, tp):
            problems.append("{}: the model's {} KV heads and tensor parallel size {} do not divide one another "
                            "(vLLM's attention layers assert it). Fix: give each replica {} cards".format(
                                label, kv_heads, tp, choices))
        limit = info.get("max_model_len_limit") or info.get("max_position_embeddings")
        wanted = instance.get("max_model_len")
        if limit and wanted and int(wanted) > int(limit):
            problems.append("{label}: User-specified max_model_len ({wanted}) is greater than the derived "
                            "max_model_len ({limit}), vLLM refuses to start. Fix: set max_model_len to {limit} or "
                            "less".format(label=label, wanted=wanted, limit=limit))
    return problems


def _dtype_bytes(name):
    return DTYPE_BYTES.get(str(name or "").lower())


def _numbers(instance, info, vram_mib):
    """The per-card quantities of one instance on a card of vram_mib, and what was assumed."""
    assumed = []
    tp = int(instance.get("tensor_parallel") or 1)
    checkpoint = _dtype_bytes(info.get("torch_dtype"))
    runtime = _dtype_bytes(instance.get("dtype")) if instance.get("dtype") not in (None, "", "auto") else None
    if runtime is None:
        runtime = 2 if checkpoint in (None, 4) else checkpoint
        if checkpoint is None:
            assumed.append("16-bit weights (config.json states no dtype)")
    weights = float(info.get("weights_bytes") or 0)
    if checkpoint and not info.get("quantization") and not instance.get("quantization"):
        weights = weights * runtime / checkpoint
    weights_pc = weights / tp
    seqs = instance.get("max_num_seqs")
    if not seqs:
        seqs = VLLM_MAX_NUM_SEQS if (vram_mib or 0) < 70 * 1024 else 1024
        assumed.append("max_num_seqs {} (vLLM's default)".format(seqs))
    length = instance.get("max_model_len")
    if not length:
        length = info.get("max_model_len_limit") or info.get("max_position_embeddings") or 0
        assumed.append("max_model_len {} (the model's)".format(length))
    kv_dtype = str(instance.get("kv_cache_dtype") or "auto").lower()
    kv_bytes = 1 if kv_dtype.startswith("fp8") else (_dtype_bytes(kv_dtype) or runtime)
    layers = info.get("num_hidden_layers") or 0
    if info.get("encoder_only"):
        per_token = 0
    elif info.get("kv_lora_rank"):
        per_token = layers * (info["kv_lora_rank"] + (info.get("qk_rope_head_dim") or 0)) * kv_bytes
    else:
        kv_heads = info.get("num_key_value_heads") or info.get("num_attention_heads") or 0
        per_token = 2 * layers * math.ceil(kv_heads / float(tp)) * (info.get("head_dim") or 0) * kv_bytes
    tokens = int(length) + int(info.get("encoder_positions") or 0)
    return {"tp": tp, "weights": weights_pc, "per_token": per_token, "tokens": tokens, "seqs": int(seqs),
            "length": int(length), "assumed": assumed, "heads": info.get("num_attention_heads"),
            "kv_heads": info.get("num_key_value_heads"), "all_weights": weights}


def _margin(instance, weights_pc, margin):
    multimodal = instance.get("kind") == "vision" or bool(instance.get("limit_mm_per_prompt"))
    return (margin["fixed_gib"] * GIB + margin["weights_fraction"] * weights_pc
            + (margin["multimodal_gib"] * GIB if multimodal else 0))


def _need(numbers, margin_bytes, seqs=None, length_tokens=None, tp=None, weights=None):
    tp_now = numbers["tp"]
    weights_pc = (weights if weights is not None else numbers["all_weights"]) / (tp or tp_now)
    per_token = numbers["per_token"]
    if tp and tp != tp_now and numbers["kv_heads"]:
        per_token = per_token / math.ceil(numbers["kv_heads"] / float(tp_now)) * math.ceil(
            numbers["kv_heads"] / float(tp))
    tokens = numbers["tokens"] if length_tokens is None else length_tokens
    return weights_pc + per_token * tokens * (numbers["seqs"] if seqs is None else seqs) + margin_bytes


def _advice(instance, numbers, margin, have, vram, utilization, card_count):
    """Which knob to turn, with the number that fits where it can be computed."""
    margin_bytes = _margin(instance, numbers["weights"], margin)
    need = _need(numbers, margin_bytes)
    options = []
    room = have - numbers["weights"] - margin_bytes
    per_seq = numbers["per_token"] * numbers["tokens"]
    if per_seq and room >= per_seq:
        fit = int(room // per_seq)
        if fit < numbers["seqs"]:
            options.append("lower max_num_seqs to {} (now {})".format(fit, numbers["seqs"]))
    if numbers["per_token"] and room > 0:
        encoder = numbers["tokens"] - numbers["length"]
        fit = int(room // (numbers["per_token"] * numbers["seqs"])) - encoder
        fit = fit // 256 * 256
        if 256 <= fit < numbers["length"]:
            options.append("lower max_model_len to {} (now {})".format(fit, numbers["length"]))
    if vram:
        wanted = math.ceil(need / vram * 100) / 100.0
        if wanted <= MAX_ADVISED_UTILIZATION and wanted > (utilization or 0):
            options.append("raise gpu_memory_utilization to {:.2f} (now {})".format(wanted, utilization))
    heads, kv_heads = numbers["heads"], numbers["kv_heads"]
    for tp in range(numbers["tp"] + 1, card_count + 1):
        if heads and heads % tp == 0 and _kv_divides(kv_heads, tp) and \
                _need(numbers, _margin(instance, numbers["all_weights"] / tp, margin), tp=tp) <= have:
            options.append("use tensor parallel {tp} ({tp} cards per replica)".format(tp=tp))
            break
    if not instance.get("quantization") and not numbers.get("quantized"):
        quarter = numbers["all_weights"] * 0.3  # 4-bit AWQ/GPTQ weights with their scales
        if _need(numbers, _margin(instance, quarter / numbers["tp"], margin), weights=quarter) <= have:
            options.append("serve a 4-bit quantized model (AWQ/GPTQ: about {:.1f} GiB of weights per card)".format(
                quarter / numbers["tp"] / GIB))
    if not options:
        return "nothing below the current settings fits: the weights ({:.2f} GiB per card) and margin leave {:.2f} " \
               "GiB; use more cards or a smaller model".format(numbers["weights"] / GIB, room / GIB)
    return "; or ".join(options)


def vllm_vram_budget(instances, model_infos, cards, margin=None, card_count=None):
    """Per instance and card: need vs have in GiB, whether it fits, by how much it is short and which knob to
    turn. Returns {rows, table, fits, short}: rows [{service, instance, card, tp, weights_gib, kv_gib, margin_gib,
    need_gib, have_gib, fits, short_gib, starts, advice, assumed}], a text table, whether every row fits, and
    the advice lines of the rows that do not."""
    margin = dict(DEFAULT_MARGIN, **(margin if isinstance(margin, dict) else
                                     {"fixed_gib": float(margin)} if margin is not None else {}))
    infos = _infos(model_infos)
    by_index = dict((int(c["index"]), c) for c in cards or [])
    card_count = int(card_count or len(by_index) or 8)
    rows = []
    for instance in instances:
        if instance.get("placement") == "cpu":
            # On the host's processors: no VRAM to budget (its KV cache is VLLM_CPU_KVCACHE_SPACE of host memory).
            rows.append({"service": instance.get("service"), "instance": instance.get("name"), "card": "cpu",
                         "tp": 1, "weights_gib": None, "kv_gib": None, "margin_gib": None, "need_gib": None,
                         "have_gib": None, "fits": True, "short_gib": 0.0, "starts": True, "advice": "",
                         "assumed": [], "placement": "cpu"})
            continue
        info, problem = _info_problem(instance, infos)
        for index in instance.get("cards") or []:
            card = by_index.get(int(index), {})
            vram_mib = card.get("vram_total_mib")
            row = {"service": instance.get("service"), "instance": instance.get("name"), "card": index,
                   "tp": instance.get("tensor_parallel") or 1, "weights_gib": None, "kv_gib": None,
                   "margin_gib": None, "need_gib": None, "have_gib": None, "fits": None, "short_gib": None,
                   "starts": None, "advice": "", "assumed": []}
            rows.append(row)
            lacking = [] if problem else sorted(set(info.get("missing") or []) & {"num_hidden_layers",
                                                                                  "num_attention_heads"})
            if problem or lacking:
                row["advice"] = problem or "{} lacks {}: the budget cannot be computed; add them to it".format(
                    info.get("config_file"), ", ".join(lacking))
                continue
            utilization = instance.get("gpu_memory_utilization")
            numbers = _numbers(instance, info, vram_mib)
            if not utilization:
                utilization = VLLM_GPU_MEMORY_UTILIZATION
                numbers["assumed"].append("gpu_memory_utilization {} (vLLM's default)".format(utilization))
            numbers["quantized"] = bool(info.get("quantization"))
            margin_bytes = _margin(instance, numbers["weights"], margin)
            kv = numbers["per_token"] * numbers["tokens"] * numbers["seqs"]
            need = numbers["weights"] + kv + margin_bytes
            row.update({"weights_gib": round(numbers["weights"] / GIB, 2), "kv_gib": round(kv / GIB, 2),
                        "margin_gib": round(margin_bytes / GIB, 2), "need_gib": round(need / GIB, 2),
                        "assumed": numbers["assumed"]})
            if not vram_mib:
                row["advice"] = "the card's VRAM is unknown (dcu_facts found no vram_total_mib)"
                continue
            vram = float(vram_mib) * (1 << 20)
            have = vram * utilization
            one = numbers["weights"] + numbers["per_token"] * numbers["tokens"] + margin_bytes
            row.update({"have_gib": round(have / GIB, 2), "fits": need <= have,
                        "short_gib": round(max(0.0, need - have) / GIB, 2), "starts": one <= have})
            if not row["fits"]:
                row["advice"] = _advice(instance, numbers, margin, have, vram, utilization, card_count)
    groups = []
    for row in rows:
        if row["fits"] is True:
            continue
        key = (row["service"], row["advice"], row["short_gib"], row["starts"], tuple(row["assumed"]))
        group = [g for g in groups if g["key"] == key]
        if group:
            group = group[0]
        else:
            group = {"key": key, "row": row, "instances": [], "cards": []}
            groups.append(group)
        if row["instance"] not in group["instances"]:
            group["instances"].append(row["instance"])
        group["cards"].append(row["card"])
    short = [_advice_line(group) for group in groups]
    return {"rows": rows, "table": _table(rows, margin, short), "fits": all(r["fits"] is True for r in rows),
            "short": short}


def _advice_line(group):
    row = group["row"]
    service = "the default service" if row["service"] == "" else "service {}".format(row["service"])
    where = "{}, instance{} {} (card{} {})".format(
        service, "s" if len(group["instances"]) > 1 else "", ", ".join(group["instances"]),
        "s" if len(group["cards"]) > 1 else "", ", ".join(str(c) for c in group["cards"]))
    if row["fits"] is None:
        return "{}: {}".format(where, row["advice"])
    state = "vLLM would not start: not even one max_model_len sequence fits" if not row["starts"] else \
        "vLLM starts, but max_num_seqs requests of max_model_len tokens do not fit at once: it queues and preempts"
    return "{}: short by {:.2f} GiB per card - {}. Fix: {}.{}".format(
        where, row["short_gib"], state, row["advice"],
        " Assumed: {}.".format(", ".join(row["assumed"])) if row["assumed"] else "")


def _gib_text(value):
    return "-" if value is None else "{:.2f}".format(value)


def _table(rows, margin, short):
    header = ("SERVICE", "INSTANCE", "CARD", "TP", "WEIGHTS", "KV CACHE", "MARGIN", "NEED", "HAVE", "RESULT")
    lines = [header]
    for row in rows:
        if row["fits"] is None:
            result = "unknown"
        else:
            result = ("on CPU, no VRAM" if row.get("placement") == "cpu"
                      else "fits" if row["fits"] else "short {:.2f}".format(row["short_gib"]))
        lines.append((str(row["service"] or "-"), str(row["instance"]), str(row["card"]), str(row["tp"]),
                      _gib_text(row["weights_gib"]), _gib_text(row["kv_gib"]), _gib_text(row["margin_gib"]),
                      _gib_text(row["need_gib"]), _gib_text(row["have_gib"]), result))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    numeric = set(range(2, 9))
    text = ["VRAM budget per card, GiB: need = weights/TP + KV cache (every sequence at max_model_len) + margin "
            "({:g} GiB + {:g} % of the weights{}); have = VRAM x gpu_memory_utilization".format(
                margin["fixed_gib"], margin["weights_fraction"] * 100,
                " + {:g} GiB for images".format(margin["multimodal_gib"]) if margin["multimodal_gib"] else "")]
    for line in lines:
        cells = [cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i]) for i, cell in enumerate(line)]
        text.append("  ".join(cells).rstrip())
    return "\n".join(text + short)
