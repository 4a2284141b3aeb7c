# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The host's container engine and SELinux (plugin_utils/engine.py); documented in
plugins/filter/container_run_flags.yml and plugins/filter/container_engine_problem.yml."""

from ansible_collections.dcu.serving.plugins.plugin_utils import engine


class FilterModule(object):
    def filters(self):
        return {
            "container_run_flags": engine.container_run_flags,
            "container_engine_problem": engine.container_engine_problem,
        }
