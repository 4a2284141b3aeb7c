# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The fleet's gateway: its LiteLLM config from the serving hosts (module_utils/gateway_config.py, shared with
dcu_serving.gateway), its secrets' problems, its keys file and its health probes (plugin_utils/gateway.py); each
filter documented in plugins/filter/<name>.yml."""

from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.module_utils import gateway_config as gc
from ansible_collections.dcu.serving.plugins.plugin_utils import gateway, topology


def gateway_config(hosts, settings=None):
    try:
        return gc.gateway_config(hosts, settings)
    except gc.FleetError as e:
        raise AnsibleFilterError(str(e)) from None


class FilterModule:
    def filters(self):
        return {
            "gateway_config": gateway_config,
            "gateway_caller_problems": gateway.caller_problems,
            "gateway_caller_keys": gateway.caller_keys,
            "gateway_probe_key": gateway.probe_key,
            "gateway_trust": topology.gateway_trust,
            "gateway_deployment_ids": gateway.deployment_ids,
            "gateway_probes": gateway.probe_results,
        }
