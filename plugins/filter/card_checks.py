# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Whether a host's cards match the inventory (plugin_utils/cards.py); documented in
plugins/filter/dcu_card_problem.yml."""

from ansible_collections.dcu.serving.plugins.plugin_utils import cards


class FilterModule(object):
    def filters(self):
        return {
            "dcu_card_problem": cards.dcu_card_problem,
        }
