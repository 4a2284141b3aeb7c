# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""dcu.serving.serving_audit on the controller: the module reads the host; given report_dir, the report is put
together here (plugins/filter/audit.py) and written as <host>.json and <host>.md, and the fleet's summary
(fleet.json, fleet.md) is rewritten from the reports in that directory of the play's hosts. Written in this
process: a copy task per file would start a module on the controller for each (seconds, on a busy machine)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fcntl
import json
import os
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.dcu.serving.plugins.filter.audit import audit_fleet, audit_markdown, audit_report

REPORT_INPUTS = ("facts", "health", "access", "bundle", "expected", "orid", "generated")


def _write(path, text):
    """Replace path atomically: a reader never sees half a report."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix="." + os.path.basename(path))
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)


def read_gateway(report_dir):
    """What verify.yml's gateway play last found (gateway.json, which serving_audit writes given `gateway`), or None."""
    try:
        with open(os.path.join(report_dir, "gateway.json")) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


def _write_fleet(report_dir, hosts, generated):
    """fleet.json/.md from the reports of `hosts` in report_dir and gateway.json (the caller holds the lock)."""
    reports = []
    for host in hosts:
        try:
            with open(os.path.join(report_dir, host + ".json")) as handle:
                reports.append(json.load(handle))
        except (IOError, OSError, ValueError):
            pass  # not verified (yet): left out
    fleet = audit_fleet(reports, generated=generated, gateway=read_gateway(report_dir))
    _write(os.path.join(report_dir, "fleet.json"), json.dumps(fleet, indent=2, sort_keys=True) + "\n")
    _write(os.path.join(report_dir, "fleet.md"), audit_markdown(fleet))
    return [os.path.join(report_dir, "fleet.json"), os.path.join(report_dir, "fleet.md")]


def write_gateway(report_dir, gateway):
    """gateway.json, then fleet.json/.md with it, from the reports of the hosts the gateway reaches."""
    os.makedirs(report_dir, exist_ok=True)
    hosts = []
    for deployment in gateway.get("deployments") or []:
        if deployment.get("host") not in hosts:
            hosts.append(deployment.get("host"))
    with open(os.path.join(report_dir, ".fleet.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _write(os.path.join(report_dir, "gateway.json"), json.dumps(gateway, indent=2, sort_keys=True) + "\n")
        return [os.path.join(report_dir, "gateway.json"), *_write_fleet(report_dir, hosts, gateway.get("generated"))]


def write_reports(report_dir, report, hosts):
    """<host>.json/.md, then fleet.json/.md from the reports of `hosts` found in report_dir (under a lock:
    with forks, hosts finish at once). Returns the files written."""
    os.makedirs(report_dir, exist_ok=True)
    base = os.path.join(report_dir, report["host"])
    _write(base + ".json", json.dumps(report, indent=2, sort_keys=True) + "\n")
    _write(base + ".md", audit_markdown(report))
    with open(os.path.join(report_dir, ".fleet.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return [base + ".json", base + ".md", *_write_fleet(report_dir, hosts, report.get("generated"))]


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
