# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What particular vLLM images need on particular DCU cards, from Hygon's own field reports: a table keyed by the
image's vLLM version, the cards' series and the service's kind, each row with its source (docs/field-evidence.md
K3, K4). Applied by default to every instance it matches; a service turns a row off with `quirks: {ID: false}` (all
of them with `quirks: false`), and what a service sets itself - an argument in extra_args, a variable in env -
always wins. Host-level needs (vm.max_map_count on BW) are dcu_driver's (dcu_driver_sysctl)."""

import re

from ansible_collections.dcu.serving.plugins.module_utils import hysmi

# Hygon's vLLM images carry the vLLM version first in their tag: vllm:0.9.2-ubuntu22.04-dtk26.04-py3.10.
_VLLM_TAG = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:$|[-_+])")

QUIRKS = (
    {
        "id": "triton-attention",
        "why": "garbled output for multimodal and long-context requests with the default attention backends",
        "series": ("K100_AI", "K100_AI_ECO", "BW150"),
        "kinds": ("chat", "vision"),
        # --attention-backend and --mm-encoder-attn-backend are in vLLM's CLI reference from 0.12 (AttentionConfig);
        # older images know neither flag and would refuse to start.
        "vllm": ((0, 12), None),
        "args": ["--mm-encoder-attn-backend", "TRITON_ATTN", "--attention-backend", "TRITON_ATTN"],
        "env": {},
        "source": "dcu-ontrack-experience SKILL.md (Hygon ontrack tickets), index-id 69419131404, B1; the same "
                  "flags on BW1000 in FlagRelease's Hygon run, index-id 68978542405",
    },
    {
        "id": "v0-engine-for-encoders",
        "why": "Bert, bge-m3 and XLMRoberta models raise NotImplementedError on the V1 engine",
        "series": None,
        "kinds": ("embedding", "rerank"),
        # The V0 engine is gone from vLLM 0.11 on, where the V1 engine serves these models.
        "vllm": (None, (0, 11)),
        "args": [],
        "env": {"VLLM_USE_V1": "0"},
        "source": "dcu-ontrack-experience SKILL.md (Hygon ontrack tickets), index-id 69419131404, B1 ('全系')",
    },
)


def vllm_version(image):
    """(major, minor, patch) of the vLLM an image reference names in its tag, or None (the tag does not say)."""
    name = str(image or "").rsplit("/", 1)[-1]
    if ":" not in name or "vllm" not in name.split(":", 1)[0].lower():
        return None
    match = _VLLM_TAG.match(name.split(":", 1)[1])
    return tuple(int(part or 0) for part in match.groups()) if match else None


def _matches(quirk, kind, series, version):
    if quirk["kinds"] and kind not in quirk["kinds"]:
        return False
    if quirk["series"] and not any(hysmi.series_key(s) in quirk["series"] for s in series):
        return False
    low, high = quirk["vllm"]
    if low or high:
        if version is None:
            return False  # a flag an unknown version may not know: left out, not guessed
        if (low and version[:2] < low) or (high and version[:2] >= high):
            return False
    return True


def vllm_quirks(kind, series, image, wanted=True, version=None):
    """[(quirk, args, env)] of the rows that apply to an instance of `kind` on cards of `series` running `image`;
    wanted: the service's `quirks` (true, false, or {id: bool}); version: the vLLM version when the tag does not
    say it."""
    if wanted is False:
        return []
    skip = {key for key, on in (wanted.items() if isinstance(wanted, dict) else []) if on is False}
    version = version or vllm_version(image)
    return [quirk for quirk in QUIRKS if quirk["id"] not in skip and _matches(quirk, kind, series or [], version)]


def quirk_problems(wanted, label):
    """What is wrong with a service's `quirks` setting."""
    if wanted in (True, False, None):
        return []
    if not isinstance(wanted, dict):
        return ["{}: quirks is true, false or a mapping of quirk id to true/false, got {!r}".format(label, wanted)]
    known = [quirk["id"] for quirk in QUIRKS]
    return ["{}: quirks names {!r}, which is not one of {}".format(label, key, ", ".join(known))
            for key in wanted if key not in known]
