# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The vLLM instances a host runs, from its model services and cards (plugin_utils/services.py), and how a canary's
soak judges its answers (plugin_utils/canary.py); each filter documented in plugins/filter/<name>.yml."""

from ansible_collections.dcu.serving.plugins.plugin_utils import canary, services


class FilterModule(object):
    def filters(self):
        return {
            "vllm_services": services.vllm_services,
            "vllm_service_problems": services.vllm_service_problems,
            "vllm_instances": services.vllm_instances,
            "env_file_problems": services.env_file_problems,
            "vllm_kernel_advice": services.vllm_kernel_advice,
            "vllm_served_models": services.served_models,
            "vllm_model_kinds": services.served_model_kinds,
            "vllm_memory_max": services.largest_memory,
            "canary_error_problem": canary.canary_error_problem,
        }
