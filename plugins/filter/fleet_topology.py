# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What connects to what across the fleet, from the facts each role exports (plugin_utils/topology.py); each filter
documented in plugins/filter/<name>.yml."""

from ansible_collections.dcu.serving.plugins.plugin_utils import topology


class FilterModule(object):
    def filters(self):
        return {
            "prometheus_targets": topology.prometheus_targets,
            "prometheus_expected_cards": topology.prometheus_expected_cards,
            "gateway_hosts": topology.gateway_hosts,
            "exporter_card_units": topology.exporter_card_units,
            "facts_by_host": topology.facts_by_host,
            "monitoring_hosts": topology.monitoring_hosts,
        }
