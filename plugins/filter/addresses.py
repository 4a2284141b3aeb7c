# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""A listen address (HOST:PORT) to the URL a client uses, on the host or from elsewhere (module_utils/addresses.py,
shared with cluster_health and dcu-doctor); each filter documented in plugins/filter/<name>.yml."""

from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.module_utils import addresses


def local_url(listen, what="listen", scheme="http"):
    try:
        return addresses.local_url(listen, scheme, what)
    except addresses.ListenError as e:
        raise AnsibleFilterError(str(e)) from None


def public_url(listen, address, what="listen", scheme="http"):
    try:
        return addresses.public_url(listen, address, scheme, what)
    except addresses.ListenError as e:
        raise AnsibleFilterError(str(e)) from None


def reachable_elsewhere(listen, what="listen"):
    try:
        return addresses.reachable_elsewhere(listen, what)
    except addresses.ListenError as e:
        raise AnsibleFilterError(str(e)) from None


class FilterModule(object):
    def filters(self):
        return {"local_url": local_url, "public_url": public_url, "reachable_elsewhere": reachable_elsewhere}
