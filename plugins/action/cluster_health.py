# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""dcu.serving.cluster_health on the controller: the module's wait in slices of report_every seconds, with a
progress line after each (a module cannot print while it runs). A settled failure or success ends it at once;
the module's own timeout still bounds the whole wait. It tells the module the host's inventory name (`host`), for
the commands a diagnosis gives. See plugins/modules/cluster_health.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

REPORT_EVERY = 10.0


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        args.setdefault("host", task_vars.get("inventory_hostname"))  # the --limit of the commands it suggests
        try:
            timeout = float(args.get("timeout", 300))
            every = float(args.get("report_every") or REPORT_EVERY)
        except (TypeError, ValueError):
            every = timeout = None  # the module names the bad option
        started = time.monotonic()
        while True:
            if timeout is not None and every > 0:
                remaining = max(0.0, timeout - (time.monotonic() - started))
                args.update(timeout=remaining, report_every=every if remaining > every else 0)
            answer = self._execute_module(module_name="dcu.serving.cluster_health", module_args=args,
                                          task_vars=task_vars)
            if answer.get("failed") or not answer.get("waiting") or timeout is None or every <= 0:
                break
            # On stderr: a callback that prints JSON (ansible.posix.json) keeps stdout to itself.
            display.display("%s: waiting %ds: %s" % (task_vars.get("inventory_hostname"), time.monotonic() - started,
                                                     "; ".join(answer["waiting"])), stderr=True)
        answer.pop("waiting", None)
        answer["elapsed"] = round(time.monotonic() - started, 2)
        result.update(answer)
        return result
