# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The entries dcu.serving.config_files takes, from the roles' lists, and a user's groups (plugin_utils/host_files.py);
each filter documented in plugins/filter/<name>.yml."""

from ansible_collections.dcu.serving.plugins.plugin_utils import host_files


class FilterModule(object):
    def filters(self):
        return {
            "config_directories": host_files.directory_entries,
            "vllm_env_files": host_files.env_file_entries,
            "previous_config_files": host_files.previous_files,
            "member_groups": host_files.member_groups,
        }
