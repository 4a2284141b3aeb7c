# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""verify.yml's audit reports (plugin_utils/audit.py); each filter documented in plugins/filter/<name>.yml."""

from ansible_collections.dcu.serving.plugins.plugin_utils import audit


class FilterModule(object):
    def filters(self):
        return {
            "audit_report": audit.audit_report,
            "audit_fleet": audit.audit_fleet,
            "audit_gateway": audit.audit_gateway,
            "audit_gateway_lines": audit.audit_gateway_lines,
            "audit_markdown": audit.audit_markdown,
        }
