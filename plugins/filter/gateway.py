# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""gateway_config: the LiteLLM config of a fleet's gateway from its serving hosts (module_utils/gateway_config)."""

from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.module_utils import gateway_config as gc


def gateway_config(hosts, settings=None):
    try:
        return gc.gateway_config(hosts, settings)
    except gc.FleetError as e:
        raise AnsibleFilterError(str(e)) from None


class FilterModule:
    def filters(self):
        return {"gateway_config": gateway_config}
