# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Where dcu.serving puts things on a host, spelled once (module_utils/host_paths.py, shared with the modules and
dcu-doctor); documented in plugins/filter/host_path.yml."""

from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.module_utils import host_paths


def host_path(name):
    try:
        return host_paths.host_path(name)
    except KeyError as e:
        raise AnsibleFilterError(str(e.args[0])) from None


class FilterModule(object):
    def filters(self):
        return {"host_path": host_path}
