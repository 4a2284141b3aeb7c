"""The checks against each model's config.json and the VRAM budget per card (plugins/plugin_utils/vram.py),
on the platform host of tests/modules/services_host.py with model_info's answers for real model directories.

Expected numbers by hand (GiB = 2^30 bytes):
  Qwen2.5-14B, TP 2: weights 29.54e9 B / 2 = 13.76; KV per token per card 2 x 48 x 8/2 x 128 x 2 B = 96 KiB,
    x 32768 tokens x 8 sequences = 24.00; margin 1 + 5 % x 13.76 = 1.69; have 65520 MiB x 0.9 = 57.59.
  MiniCPM-V 4.5: weights 17.418e9 B = 16.22; KV 2 x 36 x 8 x 128 x 2 B = 144 KiB/token x 32768 x 4 = 18.00;
    margin 1 + 0.81 + 1 (images) = 2.81.
  bge-m3 / bge-reranker-v2-m3: float32 files loaded in 16 bits: 2.27e9 / 2 = 1.06; encoder-only, no KV cache.
"""

from __future__ import annotations

import copy

import pytest
from modules.services_host import CARDS, DEFAULTS, SERVICES, make_model_dir

from ansible_collections.dcu.serving.plugins.module_utils.model_config import read_model_info
from ansible_collections.dcu.serving.plugins.plugin_utils.services import vllm_services
from ansible_collections.dcu.serving.plugins.plugin_utils.vram import vllm_model_problems, vllm_vram_budget

DIRS = {"/models/Qwen2.5-14B-Instruct": "qwen2.5-14b-instruct", "/models/MiniCPM-V-4_5": "minicpm-v-4.5",
        "/models/bge-m3": "bge-m3", "/models/bge-reranker-v2-m3": "bge-reranker-v2-m3",
        "/models/whisper-large-v3": "whisper-large-v3"}


@pytest.fixture(scope="module")
def infos(tmp_path_factory):
    """model_info's answer for each model directory the services name."""
    root = tmp_path_factory.mktemp("models")
    return {path: read_model_info(str(make_model_dir(root, name))) for path, name in DIRS.items()}


def instances(cards=CARDS, **changes):
    chosen = copy.deepcopy(SERVICES)
    for service in chosen:
        service.update(changes.get(service["name"], {}))
    return vllm_services(chosen, cards, DEFAULTS)


def rows_of(budget, name):
    return [r for r in budget["rows"] if r["instance"] == name]


def test_the_platform_fits(infos):
    budget = vllm_vram_budget(instances(), infos, CARDS)
    assert budget["fits"] and budget["short"] == []
    assert [(r["instance"], r["card"]) for r in budget["rows"]] == [
        ("chat-0", 0), ("chat-0", 1), ("vision-0", 2), ("vision-1", 3), ("vision-2", 4), ("vision-3", 5),
        ("embed-0", 6), ("rerank-0", 7)]
    chat = rows_of(budget, "chat-0")[0]
    assert {k: chat[k] for k in ("tp", "weights_gib", "kv_gib", "margin_gib", "need_gib", "have_gib", "fits",
                                 "short_gib", "starts")} == {
        "tp": 2, "weights_gib": 13.76, "kv_gib": 24.0, "margin_gib": 1.69, "need_gib": 39.44, "have_gib": 57.59,
        "fits": True, "short_gib": 0.0, "starts": True}
    vision = rows_of(budget, "vision-0")[0]
    assert (vision["weights_gib"], vision["kv_gib"], vision["margin_gib"]) == (16.22, 18.0, 2.81)
    embed = rows_of(budget, "embed-0")[0]
    assert (embed["weights_gib"], embed["kv_gib"], embed["have_gib"]) == (1.06, 0.0, 31.99)


def test_the_table_a_person_reads(infos):
    table = vllm_vram_budget(instances(), infos, CARDS)["table"].splitlines()
    assert table[0].startswith("VRAM budget per card, GiB: need = weights/TP + KV cache")
    assert table[1].split() == ["SERVICE", "INSTANCE", "CARD", "TP", "WEIGHTS", "KV", "CACHE", "MARGIN", "NEED",
                                "HAVE", "RESULT"]
    assert table[2] == "chat     chat-0       0   2    13.76     24.00    1.69  39.44  57.59  fits"
    assert table[8] == "embed    embed-0      6   1     1.06      0.00    1.05   2.11  31.99  fits"
    assert len({line.index("fits") for line in table[2:]}) == 1, "fixed columns"


def test_short_says_by_how_much_and_which_knob_with_the_number_that_fits(infos):
    budget = vllm_vram_budget(instances(chat={"max_num_seqs": 16}), infos, CARDS)
    assert not budget["fits"]
    chat = rows_of(budget, "chat-0")
    assert [(r["fits"], r["short_gib"], r["starts"]) for r in chat] == [(False, 5.86, True)] * 2
    assert budget["short"] == [
        "service chat, instance chat-0 (cards 0, 1): short by 5.86 GiB per card - vLLM starts, but max_num_seqs "
        "requests of max_model_len tokens do not fit at once: it queues and preempts. Fix: lower max_num_seqs to 14 "
        "(now 16); or lower max_model_len to 28672 (now 32768); or use tensor parallel 4 (4 cards per replica); or "
        "serve a 4-bit quantized model (AWQ/GPTQ: about 4.1 GiB of weights per card)."]
    assert "short 5.86" in budget["table"] and budget["table"].endswith(budget["short"][0])
    fixed = vllm_vram_budget(instances(chat={"max_num_seqs": 14}), infos, CARDS)
    assert fixed["fits"], "the advised number fits"


def test_raising_gpu_memory_utilization_when_that_is_enough(infos):
    budget = vllm_vram_budget(instances(vision={"max_num_seqs": 9}), infos, CARDS)
    (line,) = budget["short"]
    assert line.startswith("service vision, instances vision-0, vision-1, vision-2, vision-3 (cards 2, 3, 4, 5): "
                           "short by 1.95 GiB per card")
    assert "lower max_num_seqs to 8 (now 9)" in line and "raise gpu_memory_utilization to 0.94 (now 0.9)" in line
    assert vllm_vram_budget(instances(vision={"max_num_seqs": 9, "gpu_memory_utilization": 0.94}), infos,
                            CARDS)["fits"]


def test_weights_that_do_not_fit_a_card_at_all(infos):
    z100l = [dict(card, series="Z100L", vram_total_mib=32752) for card in CARDS]  # 32 GB cards
    chosen = instances(cards=z100l, chat={"cards": [0], "max_num_seqs": 4, "max_model_len": 8192},
                       vision={"cards": [1, 2, 3, 4, 5], "replicas": 5})
    budget = vllm_vram_budget(chosen, infos, z100l)
    (chat,) = rows_of(budget, "chat-0")
    assert chat["weights_gib"] == 27.51 and not chat["fits"] and not chat["starts"]
    (line,) = [line for line in budget["short"] if "chat-0" in line]
    assert "vLLM would not start: not even one max_model_len sequence fits" in line
    assert "Fix: use tensor parallel 2 (2 cards per replica); or serve a 4-bit quantized model" in line


def test_an_encoder_decoder_model_holds_cross_attention_kv(infos):
    layout = [{"name": "asr", "kind": "transcription", "models": ["whisper-large-v3"],
               "model_dir": "/models/whisper-large-v3", "cards": [0], "max_model_len": 448, "max_num_seqs": 16}]
    budget = vllm_vram_budget(vllm_services(layout, CARDS, DEFAULTS), infos, CARDS)
    (row,) = budget["rows"]
    # 2 x 32 decoder layers x 20 heads x 64 x 2 B = 160 KiB per token, (448 + 1500 encoder positions) x 16
    assert row["kv_gib"] == round(163840 * 1948 * 16 / 2 ** 30, 2) == 4.76
    assert row["weights_gib"] == 2.88 and row["fits"]


def test_kv_cache_dtype_and_dtype_change_the_bytes(infos):
    fp8 = rows_of(vllm_vram_budget(instances(chat={"kv_cache_dtype": "fp8_e4m3"}), infos, CARDS), "chat-0")[0]
    assert fp8["kv_gib"] == 12.0
    fp32 = rows_of(vllm_vram_budget(instances(embed={"dtype": "float32"}), infos, CARDS), "embed-0")[0]
    assert fp32["weights_gib"] == 2.12, "float32 asked: the file size"


def test_unset_settings_take_vllms_defaults_and_say_so(infos):
    defaults_only = [{"name": "embed", "kind": "embedding", "models": ["bge-m3"], "model_dir": "/models/bge-m3",
                      "cards": [6]}]
    chosen = vllm_services(defaults_only, CARDS, {"base_port": 8002})
    (row,) = vllm_vram_budget(chosen, infos, CARDS)["rows"]
    assert row["assumed"] == ["max_num_seqs 256 (vLLM's default)", "max_model_len 8194 (the model's)",
                              "gpu_memory_utilization 0.9 (vLLM's default)"]
    assert row["fits"] and row["have_gib"] == 57.59


def test_the_margin_is_a_parameter(infos):
    chat = instances()
    assert rows_of(vllm_vram_budget(chat, infos, CARDS, margin=3), "chat-0")[0]["margin_gib"] == 3.69
    zero = {"fixed_gib": 0, "weights_fraction": 0, "multimodal_gib": 0}
    assert rows_of(vllm_vram_budget(chat, infos, CARDS, margin=zero), "vision-0")[0]["margin_gib"] == 0.0


def test_missing_or_failed_model_info_and_unknown_vram(infos):
    registered = {"results": [
        dict(infos["/models/Qwen2.5-14B-Instruct"], path="/models/Qwen2.5-14B-Instruct", item={"name": "chat"}),
        {"failed": True, "item": "/models/MiniCPM-V-4_5/",
         "msg": "model_info: /models/MiniCPM-V-4_5 has no config.json: it is not a Hugging Face model directory"}]}
    no_vram = [dict(card, vram_total_mib=None) if card["index"] == 1 else card for card in CARDS]
    budget = vllm_vram_budget(instances(), registered, no_vram)
    assert not budget["fits"]
    assert rows_of(budget, "chat-0")[0]["fits"] is True
    assert rows_of(budget, "chat-0")[1]["advice"] == "the card's VRAM is unknown (dcu_facts found no vram_total_mib)"
    assert budget["short"] == [
        "service chat, instance chat-0 (card 1): the card's VRAM is unknown (dcu_facts found no vram_total_mib)",
        "service vision, instances vision-0, vision-1, vision-2, vision-3 (cards 2, 3, 4, 5): model_info: "
        "/models/MiniCPM-V-4_5 has no config.json: it is not a Hugging Face model directory",
        "service embed, instance embed-0 (card 6): no model_info for /models/bge-m3: run dcu.serving.model_info on "
        "it first",
        "service rerank, instance rerank-0 (card 7): no model_info for /models/bge-reranker-v2-m3: run "
        "dcu.serving.model_info on it first"]
    assert "unknown" in budget["table"]


def test_tensor_parallel_must_divide_the_attention_heads_in_vllms_words(infos):
    chosen = instances(chat={"cards": [0, 1, 2]}, vision={"cards": [3, 4, 5], "replicas": 3})
    assert vllm_model_problems(chosen, infos) == [
        "service chat, instance chat-0: Total number of attention heads (40) must be divisible by tensor parallel "
        "size (3). Fix: give each replica a number of cards that divides 40 (1, 2, 4, 8)"]
    assert vllm_model_problems(instances(), infos) == []


def test_kv_heads_must_divide_or_be_divided(infos):
    info = dict(infos["/models/Qwen2.5-14B-Instruct"], num_attention_heads=48, num_key_value_heads=8)
    layout = [dict(SERVICES[0], cards=[0, 1, 2, 3, 4, 5], allow_cross_numa=True)]
    assert vllm_model_problems(vllm_services(layout, CARDS, DEFAULTS), {"/models/Qwen2.5-14B-Instruct": info}) == [
        "service chat, instance chat-0: the model's 8 KV heads and tensor parallel size 6 do not divide one another "
        "(vLLM's attention layers assert it). Fix: give each replica 1, 2, 4, 8 cards"]


def test_a_context_longer_than_the_model_supports(infos):
    layout = [{"name": "asr", "kind": "transcription", "models": ["whisper-large-v3"],
               "model_dir": "/models/whisper-large-v3", "cards": [0]},
              {"name": "embed", "kind": "embedding", "models": ["bge-m3"], "model_dir": "/models/bge-m3",
               "cards": [1]}]
    problems = vllm_model_problems(vllm_services(layout, CARDS, DEFAULTS), infos)
    assert problems == [
        "service asr, instance asr-0: User-specified max_model_len (32768) is greater than the derived max_model_len "
        "(448), vLLM refuses to start. Fix: set max_model_len to 448 or less",
        "service embed, instance embed-0: User-specified max_model_len (32768) is greater than the derived "
        "max_model_len (8194), vLLM refuses to start. Fix: set max_model_len to 8194 or less"]


def test_yarn_rope_scaling_extends_the_context(tmp_path):
    path = make_model_dir(tmp_path, "qwen2.5-14b-instruct")
    config = (path / "config.json").read_text().replace(
        '"rope_theta"', '"rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},'
                        ' "rope_theta"')
    (path / "config.json").write_text(config)
    info = read_model_info(str(path))
    assert info["max_position_embeddings"] == 32768 and info["max_model_len_limit"] == 131072
    chosen = instances(chat={"max_model_len": 131072, "model_dir": str(path)})
    assert vllm_model_problems(chosen[:1], [info]) == []
