# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Staging an offline bundle on a host (plugin_utils/bundle_stage.py); each filter documented in
plugins/filter/<name>.yml."""

from ansible_collections.dcu.serving.plugins.module_utils import bundle_index
from ansible_collections.dcu.serving.plugins.plugin_utils import bundle_stage


class FilterModule(object):
    def filters(self):
        return {
            "bundle_staged": bundle_stage.bundle_staged,
            "bundle_stage_dirs": bundle_stage.bundle_stage_dirs,
            "bundle_unlisted": bundle_stage.bundle_unlisted,
            "bundle_changes": bundle_stage.bundle_changes,
            "bundle_debs_to_install": bundle_stage.bundle_debs_to_install,
            "bundle_index_problem": bundle_index.index_problem,
        }
