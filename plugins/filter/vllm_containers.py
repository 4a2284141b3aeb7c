# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""How each vLLM instance's container runs: `docker run` options, the images' DTK and runtime
(plugin_utils/containers.py); each filter documented in plugins/filter/<name>.yml."""

from ansible_collections.dcu.serving.plugins.plugin_utils import containers


class FilterModule(object):
    def filters(self):
        return {
            "vllm_run_options": containers.vllm_run_options,
            "vllm_device_nodes": containers.vllm_device_nodes,
            "vllm_images": containers.vllm_images,
            "vllm_image_problems": containers.vllm_image_problems,
        }
