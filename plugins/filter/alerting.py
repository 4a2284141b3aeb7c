# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Alerts that reach a person: Alertmanager's configuration, its secrets' files and its settings' problems, and the
silences and alerts of the plays that change a host (plugin_utils/alerting.py); each filter documented in
plugins/filter/<name>.yml."""

from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.module_utils import addresses
from ansible_collections.dcu.serving.plugins.plugin_utils import alerting


def alertmanager_silence(labels, seconds, who, why, silence_id=""):
    try:
        return alerting.change_silence(labels, seconds, who, why, silence_id)
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from None


def alertmanager_urls(hosts, hostvars, default_listen):
    try:
        return alerting.alertmanager_urls(hosts, hostvars, default_listen)
    except addresses.ListenError as e:
        raise AnsibleFilterError(str(e)) from None


class FilterModule(object):
    def filters(self):
        return {
            "alertmanager_config": alerting.alertmanager_config,
            "alertmanager_problems": alerting.alertmanager_problems,
            "alertmanager_secret_files": alerting.alertmanager_secret_files,
            "alertmanager_silence": alertmanager_silence,
            "alertmanager_alert": alerting.change_alert,
            "alertmanager_urls": alertmanager_urls,
        }
