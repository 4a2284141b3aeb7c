# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What vLLM would refuse at start, and whether each model fits its cards (plugin_utils/vram.py);
each filter documented in plugins/filter/<name>.yml."""

from ansible_collections.dcu.serving.plugins.plugin_utils import vram


class FilterModule(object):
    def filters(self):
        return {
            "vllm_model_problems": vram.vllm_model_problems,
            "vllm_vram_budget": vram.vllm_vram_budget,
        }
