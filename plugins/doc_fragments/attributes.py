# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What the attributes the collection's modules declare mean; each module states its support level."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # Every module: check mode, diff mode, and where it runs.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in C(check_mode) and return the changed status it predicts without modifying the target.
  diff_mode:
    description: Returns details on what has changed (or would change in C(check_mode)) when run with C(--diff).
  platform:
    description: Target operating systems the module runs on.
    support: full
    platforms: posix
"""

    # Modules that return ansible_facts.
    FACTS = r"""
options: {}
attributes:
  facts:
    description: Returns an C(ansible_facts) dictionary that updates the host's facts.
"""
