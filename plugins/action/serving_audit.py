# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""dcu.serving.serving_audit on the controller: the module reads the host; given report_dir, the report is put
together and written (plugins/plugin_utils/audit.py) as <host>.json and <host>.md, and the fleet's summary
(fleet.json, fleet.md) is rewritten from the reports in that directory of the play's hosts. Written in this
process: a copy task per file would start a module on the controller for each (seconds, on a busy machine)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.dcu.serving.plugins.plugin_utils.audit import audit_report, write_gateway, write_reports

REPORT_INPUTS = ("facts", "health", "access", "bundle", "expected", "orid", "generated", "instances")


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        report_dir = args.pop("report_dir", None)
        inputs = args.pop("report", None) or {}
        unknown = sorted(set(inputs) - set(REPORT_INPUTS))
        if unknown:
            raise AnsibleActionFail("report: unknown keys %s; it takes %s"
                                    % (", ".join(unknown), ", ".join(REPORT_INPUTS)))
        gateway = args.pop("gateway", None)
        if gateway is not None:
            if not report_dir:
                raise AnsibleActionFail("gateway: give report_dir too (where the fleet report is)")
            try:
                result["files"] = write_gateway(os.path.expanduser(report_dir), gateway)
            except (IOError, OSError) as exc:
                raise AnsibleActionFail("report_dir: cannot write the gateway's report into %s: %s"
                                        % (report_dir, exc)) from exc
            result.update(changed=False, gateway=gateway)
            return result
        gathered = self._execute_module(module_name="dcu.serving.serving_audit", module_args=args,
                                        task_vars=task_vars)
        result.update(gathered)
        if gathered.get("failed") or not report_dir:
            return result
        host = task_vars.get("inventory_hostname")
        report = audit_report(gathered, host, **inputs)
        try:
            # Output of a read-only check, also in check mode; not the host's state, so never `changed`.
            result["files"] = write_reports(os.path.expanduser(report_dir), report,
                                            task_vars.get("ansible_play_hosts_all") or [host])
        except (IOError, OSError) as exc:
            raise AnsibleActionFail("report_dir: cannot write the audit report into %s: %s"
                                    % (report_dir, exc)) from exc
        result.update(report=report, changed=False)
        return result
