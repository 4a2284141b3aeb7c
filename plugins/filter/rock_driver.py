# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What dcu_driver does about the rock driver (plugin_utils/rock.py); each filter documented in
plugins/filter/<name>.yml."""

from ansible_collections.dcu.serving.plugins.plugin_utils import rock


class FilterModule(object):
    def filters(self):
        return {
            "rock_packages": rock.rock_packages,
            "rock_install_state": rock.rock_install_state,
            "rock_module": rock.rock_module,
            "rock_reboot_reasons": rock.rock_reboot_reasons,
            "rock_package_of": rock.rock_package_of,
        }
