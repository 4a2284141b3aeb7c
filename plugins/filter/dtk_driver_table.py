# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The DTK <-> driver table applied to images and hosts (plugin_utils/dtk_check.py); each filter
documented in plugins/filter/<name>.yml."""

from ansible_collections.dcu.serving.plugins.plugin_utils import dtk_check


class FilterModule(object):
    def filters(self):
        return {
            "dtk_driver_check": dtk_check.dtk_driver_check,
            "dtk_driver_row": dtk_check.dtk_driver_row,
        }
