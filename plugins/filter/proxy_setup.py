# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What dcu_proxy installs and serves: its backends (and MinerU behind its entrance), its runtime, its pinned
requirements (plugin_utils/topology.py, plugin_utils/proxy_install.py); each filter documented in
plugins/filter/<name>.yml."""

from ansible_collections.dcu.serving.plugins.plugin_utils import proxy_install, topology


class FilterModule(object):
    def filters(self):
        return {
            "proxy_backends": topology.proxy_backends,
            "proxy_mineru": topology.proxy_mineru,
            "proxy_runtime": proxy_install.proxy_runtime,
            "proxy_requirements": proxy_install.proxy_requirements,
            "wheel_requires_python": proxy_install.wheel_requires_python,
            "venv_build_dir": proxy_install.venv_build_dir,
        }
