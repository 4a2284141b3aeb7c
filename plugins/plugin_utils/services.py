# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Model services on one host: the inventory's services (chat, vision, embedding, rerank, transcription, speech,
each on the cards it is given, or on the CPU) expanded into vLLM instances with their `vllm serve` arguments; the
refusals that must come before anything starts (cards, ports, names, NUMA); the environment the instances' env
files carry.
(Each model's config.json and the VRAM budget per card: vram.py; the containers' options: containers.py.)

vllm_services() is the one list of a host's vLLM instances: the units, the proxy's pools and the checks derive
from it (vllm_instances, deprecated, is the default layout's view of the same list). The default
layout (one service named "" over every card, one replica per card) keeps today's names: instances "0".."7",
units vllm@0..vllm@7, ports base_port + card, the same `vllm serve` arguments.
"""

import json
import re

from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.module_utils import host_kernel, hysmi
from ansible_collections.dcu.serving.plugins.plugin_utils import quirks

KINDS = ("chat", "vision", "embedding", "rerank", "transcription", "speech")
PLACEMENTS = ("dcu", "cpu")
# A CPU instance's ports: after every card's (base_port + card), and its internal range after every card's.
CPU_PORT_OFFSET = 64
# What a service's container takes from the host: `image` - Hygon's recipe, the image's own DTK with the host's hyhal
# mounted (the default); `host` - the host's DTK mounted over the image's too; `bundled` - nothing of the host's.
RUNTIMES = ("image", "host", "bundled")
_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$")
_WORD = re.compile(r"^\S+$")
# Names an environment variable may have (POSIX portable set).
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Tensor parallel over PCIe-only cards (module_utils/hysmi.py interconnect) must not use vLLM's custom all-reduce: on
# Hygon PCIe cards it can hard-lock the host on the first request, and --disable-custom-all-reduce (RCCL/HCCL) is the
# stable path (HYGON-AI/vllm-plugin-das issue #54, fix PR #55, BW100 TP=2 under DTK 26.04; ROCm/vllm issue #390);
# and RCCL's LL protocol hangs over PCIe without HSA_FORCE_FINE_GRAIN_PCIE=1 (docs/field-evidence.md K2).
PCIE_TP_ENV = {"HSA_FORCE_FINE_GRAIN_PCIE": "1"}

# What each kind adds to `vllm serve` when the service does not say: pooling models run with
# `--runner pooling` (vLLM >= 0.10.1; --convert stays auto, so a native XLMRobertaModel or
# *ForSequenceClassification is served as it is and a *ForCausalLM embedder is adapted). vLLM 0.11 still
# accepts the older `--task embed|score` with a deprecation warning (removed in 0.13): set `task` on a
# service whose image runs vLLM < 0.10.1.
_DEFAULT_RUNNER = {"embedding": "pooling", "rerank": "pooling"}
# Speech synthesis (CosyVoice3, Qwen3-TTS) is served by vLLM-Omni: `vllm serve MODEL --omni` answers
# /v1/audio/speech with audio (docs.vllm.ai/projects/vllm-omni, serving/speech_api).
_KIND_ARGS = {"speech": ["--omni"]}
_CHAT_KINDS = ("chat", "vision")


def env_file_problems(env):
    """What keeps `env` ({name: value}) from being written as a systemd EnvironmentFile, one line each."""
    problems = []
    for name, value in sorted((env or {}).items()):
        if not _ENV_NAME.match(str(name)):
            problems.append("{!r} is not an environment variable name".format(name))
        text = str(value)
        if any(char in text for char in "\n\r\\\"'"):
            problems.append("{}'s value must be plain text without quotes, backslashes or line breaks".format(name))
    return problems


def _label(service):
    name = service.get("name") if isinstance(service, dict) else None
    return "the default service" if name == "" else "service {}".format(name if name else "(unnamed)")


def interconnect(cards):
    """'hlink' when every card is an HLink (OAM) series, 'pcie' when one is PCIe-only, else 'unknown'."""
    return hysmi.interconnect([card.get("series") for card in cards])


def _numa(card):
    node = card.get("numa_node")
    try:
        node = int(node)
    except (TypeError, ValueError):
        return None
    return node if node >= 0 else None


def _as_int(value, what, problems, label, minimum=1, maximum=None):
    if value is None or value == "":
        return None
    try:
        number = int(value)
        if isinstance(value, float) and value != number:
            raise ValueError
    except (TypeError, ValueError):
        problems.append("{}: {} must be a whole number, got {!r}".format(label, what, value))
        return None
    if number < minimum or (maximum is not None and number > maximum):
        problems.append("{}: {} must be {}, got {}".format(
            label, what, "at least {}".format(minimum) if maximum is None else "{}-{}".format(minimum, maximum),
            number))
        return None
    return number


def _as_bool(value):
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)\s*$")
_SIZE_UNITS = "KMGT"


def memory_bytes(size):
    """48G -> 51539607552 (K, M, G, T: powers of 1024, as systemd and Docker read them); None when it is no size."""
    match = _SIZE.match(str(size)) if not isinstance(size, bool) else None
    if not match or int(match.group(1)) == 0:
        return None
    return int(match.group(1)) * 1024 ** (_SIZE_UNITS.index(match.group(2)) + 1 if match.group(2) else 0)


def memory_size(count):
    """51539607552 -> 48G: the largest unit that divides it, as systemd's MemoryMax= and Docker's --memory read it."""
    for power in range(len(_SIZE_UNITS), 0, -1):
        if count % 1024 ** power == 0:
            return "{}{}".format(count // 1024 ** power, _SIZE_UNITS[power - 1])
    return str(count)


def largest_memory(instances):
    """The largest memory_max of the instances ('' when none has one): the host runtime's one MemoryMax=."""
    sizes = [i.get("memory_max") for i in instances or [] if i.get("memory_max")]
    return max(sizes, key=memory_bytes) if sizes else ""


def _pick(service, defaults, key, fallback=None):
    value = service.get(key)
    if value is None:
        value = defaults.get(key)
    return fallback if value is None else value


def _number_text(value):
    """0.9 -> '0.9', 4 -> '4' (as the role's `| string` renders them)."""
    return repr(value) if isinstance(value, float) else str(value)


def _models(service, label, problems):
    models = service.get("models")
    if isinstance(models, str):
        models = [models]
    if not isinstance(models, list) or not models:
        problems.append("{}: models must list the served model names (the first is the primary), got {!r}".format(
            label, models))
        return []
    bad = [m for m in models if not isinstance(m, str) or not _WORD.match(m)]
    if bad:
        problems.append("{}: served model names are one word each (clients send them as `model`), got {}".format(
            label, ", ".join(repr(m) for m in bad)))
    doubled = sorted(set(m for m in models if models.count(m) > 1))
    if doubled:
        problems.append("{}: models lists {} twice".format(label, ", ".join(doubled)))
    return [m for m in models if isinstance(m, str) and _WORD.match(m)]


def _serve_args(spec):
    """The `vllm serve` arguments after the model directory (host and port are the unit's)."""
    args = ["--served-model-name"]
    args += spec["models"]
    for flag, key in (("--max-num-seqs", "max_num_seqs"), ("--max-model-len", "max_model_len"),
                      ("--gpu-memory-utilization", "gpu_memory_utilization")):
        if spec[key] is not None and not (key == "gpu_memory_utilization" and spec["placement"] == "cpu"):
            args += [flag, _number_text(spec[key])]
    if spec["limit_mm_per_prompt"]:
        args += ["--limit-mm-per-prompt", json.dumps(spec["limit_mm_per_prompt"], separators=(",", ":"),
                                                     sort_keys=True)]
    if spec["trust_remote_code"]:
        args.append("--trust-remote-code")
    if spec["dtype"]:
        args += ["--dtype", spec["dtype"]]
    if spec["tensor_parallel"] > 1:
        args += ["--tensor-parallel-size", str(spec["tensor_parallel"])]
        if spec["disable_custom_all_reduce"]:
            args.append("--disable-custom-all-reduce")
    if spec["quantization"]:
        args += ["--quantization", spec["quantization"]]
    if spec["kv_cache_dtype"]:
        args += ["--kv-cache-dtype", spec["kv_cache_dtype"]]
    if spec["task"]:
        args += ["--task", spec["task"]]
    else:
        if spec["runner"]:
            args += ["--runner", spec["runner"]]
        if spec["convert"]:
            args += ["--convert", spec["convert"]]
    args += _KIND_ARGS.get(spec["kind"], [])
    if spec["tool_call_parser"]:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", spec["tool_call_parser"]]
    if spec["chat_template"]:
        args += ["--chat-template", spec["chat_template"]]
    return args + list(spec.get("quirk_args") or []) + [str(arg) for arg in spec["extra_args"]]


def _service_spec(service, defaults, label, problems):
    """The settings of one service with the role's defaults applied, checked; None when unusable."""
    kind = service.get("kind")
    if kind not in KINDS:
        problems.append("{}: kind {!r} is not one of {}".format(label, kind, ", ".join(KINDS)))
        return None
    spec = {"kind": kind, "models": _models(service, label, problems)}
    spec["placement"] = service.get("placement") or "dcu"
    if spec["placement"] not in PLACEMENTS:
        problems.append("{}: placement {!r} is not dcu (its cards) or cpu (no card: the host's processors, a CPU "
                        "build of vLLM)".format(label, spec["placement"]))
        spec["placement"] = "dcu"
    model_dir = service.get("model_dir")
    if not isinstance(model_dir, str) or not model_dir.startswith("/") or not _WORD.match(model_dir):
        problems.append("{}: model_dir must be an absolute path without spaces (the model directory on the "
                        "host), got {!r}".format(label, model_dir))
    spec["model_dir"] = model_dir
    spec["image"] = _pick(service, defaults, "image", "")
    spec["runtime"] = _pick(service, defaults, "runtime", "image")
    if spec["runtime"] not in RUNTIMES:
        problems.append("{}: runtime {!r} is not image (the image's own DTK with the host's hyhal mounted, Hygon's "
                        "recipe), host (the host's hyhal and DTK mounted) or bundled (the image carries its own "
                        "runtime)".format(label, spec["runtime"]))
    spec["max_model_len"] = _as_int(_pick(service, defaults, "max_model_len"), "max_model_len", problems, label)
    spec["max_num_seqs"] = _as_int(_pick(service, defaults, "max_num_seqs"), "max_num_seqs", problems, label)
    utilization = _pick(service, defaults, "gpu_memory_utilization")
    if utilization is not None:
        try:
            utilization = float(utilization)
            if not 0 < utilization <= 1:
                raise ValueError
        except (TypeError, ValueError):
            problems.append("{}: gpu_memory_utilization is the fraction of each card's VRAM vLLM may use, "
                            "above 0 and at most 1 (e.g. 0.9), got {!r}".format(label, utilization))
            utilization = None
    spec["gpu_memory_utilization"] = utilization
    limit = service.get("limit_mm_per_prompt")
    if limit is None and kind == "vision":
        limit = defaults.get("limit_mm_per_prompt")
    if limit and kind not in _CHAT_KINDS:
        problems.append("{}: limit_mm_per_prompt is for chat and vision models, not {}".format(label, kind))
        limit = None
    if limit and (not isinstance(limit, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in limit.values())):
        problems.append("{}: limit_mm_per_prompt maps a modality to a count, e.g. {{image: 9}}, got {!r}".format(
            label, limit))
        limit = None
    spec["limit_mm_per_prompt"] = dict(limit) if limit else {}
    for key in ("dtype", "quantization", "kv_cache_dtype", "tool_call_parser", "chat_template", "task",
                "convert"):
        value = service.get(key) if key not in ("dtype",) else _pick(service, defaults, key, "")
        if value is not None and value != "" and not (isinstance(value, str) and _WORD.match(value)):
            problems.append("{}: {} must be one word, got {!r}".format(label, key, value))
            value = None
        spec[key] = value or None
    if spec["task"] and (service.get("runner") or spec["convert"]):
        problems.append("{}: task is the older spelling of runner/convert (vLLM < 0.10.1); set one or the "
                        "other".format(label))
    spec["runner"] = service.get("runner") or (None if spec["task"] else _DEFAULT_RUNNER.get(kind))
    if spec["runner"] is not None and spec["runner"] not in ("auto", "generate", "pooling"):
        problems.append("{}: runner {!r} is not auto, generate or pooling".format(label, spec["runner"]))
    if spec["quantization"] in ("none", "auto"):
        spec["quantization"] = None  # left to the model's config.json
    for key in ("tool_call_parser", "chat_template"):
        if spec[key] and kind not in _CHAT_KINDS:
            problems.append("{}: {} is for chat and vision models, not {}".format(label, key, kind))
            spec[key] = None
    spec["trust_remote_code"] = _as_bool(_pick(service, defaults, "trust_remote_code", False))
    spec["memory_per_card"] = _pick(service, defaults, "memory_per_card", "")
    if spec["memory_per_card"] not in ("", None) and memory_bytes(spec["memory_per_card"]) is None:
        problems.append("{}: memory_per_card is the host memory an instance may use per card it serves, a size "
                        "such as 48G (K, M, G, T: powers of 1024), or empty for no limit, got {!r}".format(
                            label, spec["memory_per_card"]))
        spec["memory_per_card"] = ""
    extra = _pick(service, defaults, "extra_args") or []
    if not isinstance(extra, list) or not all(isinstance(a, (str, int, float)) for a in extra):
        problems.append("{}: extra_args must be a list of arguments, one per item, got {!r}".format(label, extra))
        extra = []
    spec["extra_args"] = extra
    env = dict(defaults.get("env") or {})
    env.update(service.get("env") or {})
    problems += ["{}: env: {}".format(label, p) for p in env_file_problems(env)]
    if spec["placement"] == "cpu":
        # vLLM's CPU backend sizes its KV cache from this (GiB), not from a card's memory.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(_pick(service, defaults, "cpu_kv_cache_space", 4)))
    spec["env"] = {str(k): str(v) for k, v in env.items()}
    spec["start_grace"] = _as_int(_pick(service, defaults, "start_grace"), "start_grace", problems, label)
    spec["allow_cross_numa"] = _as_bool(service.get("allow_cross_numa", False))
    spec["disable_custom_all_reduce"] = service.get("disable_custom_all_reduce")
    spec["quirks_wanted"] = service.get("quirks", True)
    problems += quirks.quirk_problems(spec["quirks_wanted"], label)
    spec["cpu_limit"] = None
    if spec["placement"] == "cpu":
        limit = service.get("cpu_limit")
        if limit is not None:
            try:
                limit = float(limit)
                if limit <= 0:
                    raise ValueError
                spec["cpu_limit"] = _number_text(int(limit) if limit == int(limit) else limit)
            except (TypeError, ValueError):
                problems.append("{}: cpu_limit is the processors the instance may use (docker --cpus), e.g. 8, "
                                "got {!r}".format(label, limit))
        if service.get("runtime") in ("host", "image"):
            problems.append("{}: runtime {} mounts the host's DCU runtime, which a CPU instance does not use: "
                            "leave runtime out".format(label, service["runtime"]))
        spec["runtime"] = "bundled"  # nothing of the host's DCU runtime is mounted
    return spec


def _cards_of(service, label, problems):
    cards = service.get("cards")
    if not isinstance(cards, list) or not cards:
        problems.append("{}: cards must list the card indexes it runs on, got {!r}".format(label, cards))
        return []
    indexes = []
    for card in cards:
        index = _as_int(card, "a card index", problems, label, minimum=0)
        if index is not None:
            indexes.append(index)
    doubled = sorted(set(i for i in indexes if indexes.count(i) > 1))
    if doubled:
        problems.append("{}: cards lists card {} twice".format(label, ", ".join(str(i) for i in doubled)))
    return indexes


def _expand(services, cards, defaults):
    """(instances, problems): every problem found, each naming the service and the fix."""
    problems = []
    defaults = dict(defaults or {})
    host_cards = {}
    for card in cards or []:
        host_cards[int(card["index"])] = card
    host_list = ", ".join(str(i) for i in sorted(host_cards)) or "none"
    if not isinstance(services, list) or not services:
        return [], ["no service to run: list at least one (name, kind, models, model_dir, cards)"]
    base_port = _as_int(defaults.get("base_port", 8002), "base_port", problems, "the defaults", 1, 65535)
    internal_base = _as_int(defaults.get("internal_port_base", 20000), "internal_port_base", problems,
                            "the defaults", 1, 65535)
    stride = _as_int(defaults.get("internal_port_stride", 100), "internal_port_stride", problems,
                     "the defaults", 10)
    client_host = defaults.get("client_host") or "127.0.0.1"
    cpulists = {}
    for node, cpus in (defaults.get("cpulists") or {}).items():
        cpulists[int(node)] = cpus

    names = {}
    cpu_instances = []
    owners = {}  # card -> [service labels]
    served = {}  # model name -> [service labels]
    instances = []
    for position, service in enumerate(services):
        if not isinstance(service, dict):
            problems.append("service #{} is not a dictionary: {!r}".format(position + 1, service))
            continue
        label = _label(service)
        name = service.get("name")
        if isinstance(name, str) and name in names:
            label = "{} (#{})".format(label, position + 1)  # the second of two with one name
        if name == "":
            if len(services) > 1:
                problems.append("the default service (name '') is today's one-model layout and cannot be mixed "
                                "with named services: give every service a name")
        elif not isinstance(name, str) or not _NAME.match(name):
            problems.append("{}: the name must be one word of a-z, 0-9 and '-', at most 40 characters, not "
                            "starting or ending with '-' (it names units vllm@<name>-<n> and containers), "
                            "got {!r}".format(label, name))
        if isinstance(name, str):
            names.setdefault(name, 0)
            names[name] += 1
            if names[name] == 2:
                problems.append("{}: another service has this name: rename one".format(label))
        spec = _service_spec(service, defaults, label, problems)
        if spec is not None and spec["placement"] == "cpu":
            # On the CPU the cards are not used (they may stay listed: `placement: dcu` moves it back to them).
            for model in spec["models"]:
                served.setdefault(model, []).append(label)
            replicas = _as_int(service.get("replicas", 1), "replicas", problems, label)
            for replica in range(replicas or 0):
                cpu_instances.append(_cpu_instance(spec, name, replica, len(cpu_instances), base_port, internal_base,
                                                   stride, client_host))
            continue
        indexes = _cards_of(service, label, problems)
        for index in indexes:
            owners.setdefault(index, [])
            if label not in owners[index]:
                owners[index].append(label)
        missing = [i for i in indexes if i not in host_cards]
        if missing:
            problems.append("{}: card {} {} not on this host, which has cards {}: choose from those".format(
                label, ", ".join(str(i) for i in missing), "is" if len(missing) == 1 else "are", host_list))
        if spec is None:
            continue
        for model in spec["models"]:
            served.setdefault(model, [])
            served[model].append(label)
        replicas = _as_int(service.get("replicas", 1), "replicas", problems, label)
        if replicas is None or not indexes:
            continue
        if len(indexes) % replicas:
            fitting = [r for r in range(1, len(indexes) + 1) if len(indexes) % r == 0]
            problems.append("{label}: {cards} cards do not split into {replicas} replicas (tensor parallel = cards / "
                            "replicas): use replicas {fitting} or give it a multiple of {replicas} cards".format(
                                label=label, cards=len(indexes), replicas=replicas,
                                fitting=", ".join(str(r) for r in fitting)))
            continue
        tp = len(indexes) // replicas
        for replica in range(replicas):
            group = indexes[replica * tp:(replica + 1) * tp]
            instances.append(_instance(service, spec, label, name, replica, group, tp, host_cards, base_port,
                                       internal_base, stride, client_host, cpulists, problems))

    for index in sorted(owners):
        if len(owners[index]) > 1:
            problems.append("card {} is given to {}: a card serves one service; remove it from all but "
                            "one".format(index, " and ".join(owners[index])))
    for model in sorted(served):
        if len(served[model]) > 1:
            problems.append("model name {} is served by {}: the proxy routes each name to one service; rename "
                            "it in all but one (models)".format(model, " and ".join(served[model])))
    instances.sort(key=lambda i: i["cards"][0])
    instances += cpu_instances
    _port_problems(instances, problems)
    return instances, problems


def _instance(service, spec, label, name, replica, group, tp, host_cards, base_port, internal_base, stride,
              client_host, cpulists, problems):
    first = group[0]
    known = [host_cards[i] for i in group if i in host_cards]
    instance_name = str(first) if name == "" else "{}-{}".format(name, replica)
    nodes = sorted(set(n for n in (_numa(c) for c in known) if n is not None))
    if len(nodes) > 1 and not spec["allow_cross_numa"]:
        by_node = {}
        for card in known:
            by_node.setdefault(_numa(card), []).append(str(card["index"]))
        problems.append("{}: instance {} would span NUMA nodes {} (cards {}): tensor parallel across nodes "
                        "crosses the CPU interconnect; give it cards of one node ({}) or set allow_cross_numa: "
                        "true".format(label, instance_name, " and ".join(str(n) for n in nodes),
                                      ", ".join(str(i) for i in group),
                                      "; ".join("node {}: cards {}".format(n, ", ".join(by_node[n]))
                                                for n in sorted(by_node, key=lambda n: (n is None, n)))))
    link = interconnect(known)
    disable_car = spec["disable_custom_all_reduce"]
    disable_car = (link != "hlink") if disable_car is None else _as_bool(disable_car)
    port = (base_port or 0) + first
    internal_port = (internal_base or 0) + first * (stride or 0)
    unknown_nodes = len(known) < len(group) or any(_numa(c) is None for c in known)
    cpus = ",".join(cpulists[n] for n in nodes if n in cpulists) if nodes and not unknown_nodes else ""
    limit = spec["limit_mm_per_prompt"]
    instance = dict(spec)
    instance.update({
        "name": instance_name,
        "unit": "vllm@{}".format(instance_name),
        "container": "vllm-{}".format(instance_name),
        "service": name,
        "replica": replica,
        "model": spec["models"][0] if spec["models"] else "",
        "cards": list(group),
        "card": first,
        "tensor_parallel": tp,
        "card_nodes": [c.get("card_node") for c in known],
        "render_nodes": [c.get("render_node") for c in known],
        "pci_buses": [c.get("pci_bus") for c in known],
        "card_node": known[0].get("card_node") if known else None,
        "render_node": known[0].get("render_node") if known else None,
        "pci_bus": known[0].get("pci_bus") if known else None,
        "series": [c.get("series") for c in known],
        "interconnect": link,
        "disable_custom_all_reduce": bool(tp > 1 and disable_car),
        "numa_nodes": nodes,
        "numa_node": nodes[0] if len(nodes) == 1 and not unknown_nodes else None,
        "cpus": cpus,
        "visible_devices": ",".join(str(i) for i in group),
        "port": port,
        "url": "http://{}:{}".format(client_host, port),
        "internal_port": internal_port,
        "internal_port_stride": stride,
        "max_images": limit.get("image") if limit else None,
        # its host memory: per card, times its cards ('' without a limit)
        "memory_max": memory_size(memory_bytes(spec["memory_per_card"]) * tp) if spec["memory_per_card"] else "",
    })
    if tp > 1 and link != "hlink":
        instance["env"] = dict(PCIE_TP_ENV, **instance["env"])  # the service's own env wins
    _apply_quirks(instance)
    instance["serve_args"] = _serve_args(instance)
    return instance


def _apply_quirks(instance):
    """The rows of the quirks table that match the instance (its kind, cards and image's vLLM): their arguments
    before extra_args, their environment under the service's; a quirk whose flag the service passes itself is left
    out. instance['quirks'] names what was applied."""
    given = set(str(arg).split("=", 1)[0] for arg in instance["extra_args"])
    instance["quirks"], instance["quirk_args"] = [], []
    for quirk in quirks.vllm_quirks(instance["kind"], instance["series"], instance["image"], instance["quirks_wanted"]):
        if any(arg in given for arg in quirk["args"] if str(arg).startswith("--")):
            continue
        instance["quirks"].append(quirk["id"])
        instance["quirk_args"] += quirk["args"]
        instance["env"] = dict(quirk["env"], **instance["env"])


def _cpu_instance(spec, name, replica, position, base_port, internal_base, stride, client_host):
    """An instance on the host's processors: no card, no device, no DCU environment; ports after every card's."""
    instance_name = "{}-{}".format(name, replica)
    port = (base_port or 0) + CPU_PORT_OFFSET + position
    instance = dict(spec)
    instance.update({
        "name": instance_name, "unit": "vllm@{}".format(instance_name), "container": "vllm-{}".format(instance_name),
        "service": name, "replica": replica, "model": spec["models"][0] if spec["models"] else "",
        "cards": [], "card": None, "tensor_parallel": 1, "card_nodes": [], "render_nodes": [], "pci_buses": [],
        "card_node": None, "render_node": None, "pci_bus": None, "series": [], "interconnect": "none",
        "disable_custom_all_reduce": False, "numa_nodes": [], "numa_node": None, "cpus": "", "visible_devices": "",
        "port": port, "url": "http://{}:{}".format(client_host, port),
        "internal_port": (internal_base or 0) + (CPU_PORT_OFFSET + position) * (stride or 0),
        "internal_port_stride": stride, "max_images": spec["limit_mm_per_prompt"].get("image") or None,
    })
    _apply_quirks(instance)
    instance["serve_args"] = _serve_args(instance)
    return instance


def _port_problems(instances, problems):
    for instance in instances:
        if not 1 <= instance["port"] <= 65535:
            problems.append("{}: instance {} would listen on port {}, outside 1-65535: lower base_port".format(
                _service_label(instance), instance["name"], instance["port"]))
        last = instance["internal_port"] + (instance["internal_port_stride"] or 1) - 1
        if instance["internal_port"] < 1 or last > 65535:
            problems.append("{}: instance {}'s internal ports {}-{} (VLLM_PORT) leave 1-65535: lower "
                            "internal_port_base or internal_port_stride".format(
                                _service_label(instance), instance["name"], instance["internal_port"], last))
    for instance in instances:
        low = instance["internal_port"]
        high = low + (instance["internal_port_stride"] or 1) - 1
        for other in instances:
            if low <= other["port"] <= high:
                problems.append("{}: instance {}'s internal ports {}-{} (VLLM_PORT) hold port {} of instance {}: "
                                "move internal_port_base away from base_port".format(
                                    _service_label(instance), instance["name"], low, high, other["port"],
                                    other["name"]))


def _service_label(instance):
    return "the default service" if instance["service"] == "" else "service {}".format(instance["service"])


def vllm_service_problems(services, cards, defaults=None):
    """Every reason the services cannot run on this host (an empty list when they can), one line each,
    naming the service and the fix. The same checks vllm_services() refuses on."""
    return _expand(services, cards, defaults)[1]


def vllm_services(services, cards, defaults=None):
    """The instances the services run on this host, sorted by first card; raises with every problem.

    services: the inventory's list (name, kind, models, model_dir, image, runtime, cards, replicas, vLLM
    options, env, start_grace, allow_cross_numa); cards: ansible_facts.dcu.cards; defaults: the role's values
    (base_port, client_host, internal_port_base, internal_port_stride, image, runtime, max_model_len,
    max_num_seqs, gpu_memory_utilization, limit_mm_per_prompt, dtype, trust_remote_code, env, start_grace,
    cpulists). A service named "" is today's layout: instances named by their card.
    """
    instances, problems = _expand(services, cards, defaults)
    if problems:
        raise AnsibleFilterError("vllm_services: the services cannot run on this host:\n- " + "\n- ".join(problems))
    return instances


def served_models(services, default_model):
    """The model names a host serves, in the order its services list them: every service's `models`, or
    [default_model] for the default layout (no services). Needs no card, so other hosts' plays can read it."""
    if not services:
        return [default_model]
    names = []
    for service in services:
        models = service.get("models") if isinstance(service, dict) else None
        for model in [models] if isinstance(models, str) else models or []:
            if model not in names:
                names.append(model)
    return names


def served_model_kinds(services, default_model):
    """{model name: its service's kind} over served_models: what the gateway declares each deployment to be (LiteLLM
    probes a speech model with a synthesis, not a chat). The default layout's model is a vision model."""
    if not services:
        return {default_model: "vision"}
    kinds = {}
    for service in services:
        if not isinstance(service, dict):
            continue
        models = service.get("models")
        for model in [models] if isinstance(models, str) else models or []:
            kinds.setdefault(model, service.get("kind") or "chat")
    return kinds


# What vllm_instances (deprecated) returned per instance: the default layout's keys before services existed.
LEGACY_INSTANCE_KEYS = ("card", "port", "url", "unit", "container", "pci_bus", "card_node", "render_node",
                        "numa_node", "cpus", "internal_port", "model", "max_num_seqs", "max_model_len", "max_images")


def default_layout(cards, wanted=None, model="", model_dir=""):
    """The default layout as a service list: one service named "" serving `model` on every wanted card (all
    cards when none is named), one replica per card, so its instances are named by their card (vllm@0..)."""
    indexes = [int(i) for i in wanted or []] or [int(c["index"]) for c in cards or []]
    return [{"name": "", "kind": "vision", "models": [model] if model else [], "model_dir": model_dir,
             "cards": indexes, "replicas": len(indexes)}]


def vllm_instances(cards, wanted=None, base_port=8002, client_host="127.0.0.1", cpulists=None, model="",
                   max_num_seqs=0, max_model_len=0, max_images=None, internal_port_base=20000,
                   internal_port_stride=100):
    """Deprecated (use vllm_services): the default layout's instances, as the filter of that name returned them
    before model services existed - worked out by vllm_services, so there is one list of instances."""
    if not model:
        raise AnsibleFilterError("vllm_instances (deprecated, use vllm_services): give model, the served model name")
    defaults = {"base_port": base_port, "client_host": client_host, "cpulists": cpulists or {},
                "internal_port_base": internal_port_base, "internal_port_stride": internal_port_stride,
                "max_num_seqs": max_num_seqs or None, "max_model_len": max_model_len or None,
                "limit_mm_per_prompt": {"image": max_images} if max_images is not None else {}}
    instances = vllm_services(default_layout(cards, wanted, model, "/"), cards, defaults)
    legacy = [dict((key, instance.get(key)) for key in LEGACY_INSTANCE_KEYS) for instance in instances]
    for instance in legacy:  # 0 where unset, as before
        instance.update(max_num_seqs=instance["max_num_seqs"] or 0, max_model_len=instance["max_model_len"] or 0)
    return legacy


def vllm_kernel_advice(instances, cmdline=None, numa_balancing=None):
    """What the instances that run tensor parallel over PCIe cards need from the kernel and do not get (iommu=pt,
    NUMA balancing off), one line each with the fix; [] when nothing is missing or nothing needs it. A warning,
    not a refusal: RCCL runs without them, slower and less steadily (docs/field-evidence.md K1)."""
    units = [i["unit"] for i in instances or [] if i.get("tensor_parallel", 1) > 1 and i.get("interconnect") != "hlink"]
    if not units:
        return []
    return ["{} run tensor parallel over PCIe, and {}. Fix: {}".format(", ".join(units), what, fix)
            for what, fix in host_kernel.tensor_parallel_problems(cmdline, numa_balancing)]
