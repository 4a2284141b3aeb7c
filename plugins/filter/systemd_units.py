# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Units for the host's systemd (plugin_utils/systemd.py); documented in plugins/filter/<name>.yml."""

from ansible_collections.dcu.serving.plugins.plugin_utils import systemd


class FilterModule(object):
    def filters(self):
        return {
            "systemd_compatible": systemd.systemd_compatible,
            "failed_start_lines": systemd.failed_start_lines,
            "changed_lines": systemd.changed_lines,
        }
