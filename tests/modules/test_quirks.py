"""The quirks table (plugin_utils/quirks.py): what particular vLLM images need on particular cards, from Hygon's
field reports (docs/field-evidence.md K3, K4), applied to the instances they match, and what a service overrides."""

from __future__ import annotations

import pytest
from modules.services_host import CARDS, DEFAULTS, by_name, services

from ansible_collections.dcu.serving.plugins.plugin_utils.quirks import QUIRKS, vllm_quirks, vllm_version
from ansible_collections.dcu.serving.plugins.plugin_utils.services import vllm_service_problems, vllm_services

NEW = "harbor.sourcefind.cn:5443/dcu/admin/base/vllm:0.18.1-ubuntu22.04-dtk26.04-py3.10"
OLD = "image.sourcefind.cn:5000/dcu/admin/base/vllm:0.9.2-ubuntu22.04-dtk26.04-0130-py3.10-20260204"


@pytest.mark.parametrize("image, version", [
    (NEW, (0, 18, 1)), (OLD, (0, 9, 2)), ("dcu-serving/vllm-sim:0.11.0", (0, 11, 0)),
    ("harbor.local/sglang:0.5.12-dtk26.04", None), ("registry:5000/vllm:latest", None), ("vllm", None),
])
def test_the_vllm_version_comes_from_hygon_s_tags(image, version):
    assert vllm_version(image) == version


def test_every_row_says_why_and_where_it_comes_from():
    for quirk in QUIRKS:
        assert quirk["why"] and "index-id" in quirk["source"], quirk["id"]
        assert quirk["args"] or quirk["env"], quirk["id"]


def test_triton_attention_on_k100_ai_for_chat_and_vision_from_vllm_0_12():
    applied = [q["id"] for q in vllm_quirks("vision", ["K100_AI"], NEW)]
    assert applied == ["triton-attention"]
    assert vllm_quirks("vision", ["K100_AI"], OLD) == [], "0.9.2 knows neither flag"
    assert vllm_quirks("vision", ["BW1100"], NEW) == [], "not reported on BW1100"
    assert vllm_quirks("embedding", ["K100_AI"], NEW) == []
    assert vllm_quirks("vision", ["K100_AI"], "registry:5000/vllm:latest") == [], "unknown version: not guessed"


def test_encoders_get_the_v0_engine_only_where_it_still_exists():
    assert [q["id"] for q in vllm_quirks("rerank", ["Z100L"], OLD)] == ["v0-engine-for-encoders"]
    assert vllm_quirks("rerank", ["Z100L"], NEW) == []
    assert vllm_quirks("chat", ["Z100L"], OLD) == []


def test_instances_carry_what_applies_and_a_service_overrides_it():
    chosen = services(vision={"image": NEW}, embed={"image": OLD}, rerank={"image": OLD, "quirks": False},
                      chat={"image": NEW, "extra_args": ["--attention-backend=FLASH_ATTN"]})
    instances = by_name(vllm_services(chosen, CARDS, DEFAULTS))
    vision = instances["vision-0"]
    assert vision["quirks"] == ["triton-attention"]
    assert vision["serve_args"][-4:] == ["--mm-encoder-attn-backend", "TRITON_ATTN", "--attention-backend",
                                         "TRITON_ATTN"]
    assert instances["embed-0"]["quirks"] == ["v0-engine-for-encoders"]
    assert instances["embed-0"]["env"]["VLLM_USE_V1"] == "0"
    assert instances["rerank-0"]["quirks"] == [] and "VLLM_USE_V1" not in instances["rerank-0"]["env"]
    assert instances["chat-0"]["quirks"] == [], "the service passes --attention-backend itself"
    assert instances["chat-0"]["serve_args"][-1] == "--attention-backend=FLASH_ATTN"
    off = by_name(vllm_services(services(embed={"image": OLD, "quirks": {"v0-engine-for-encoders": False}}),
                                CARDS, DEFAULTS))
    assert off["embed-0"]["quirks"] == []


def test_a_quirks_setting_that_names_no_row_is_refused():
    problems = vllm_service_problems(services(chat={"quirks": {"triton": False}}), CARDS, DEFAULTS)
    assert problems == ["service chat: quirks names 'triton', which is not one of triton-attention, "
                        "v0-engine-for-encoders"]
