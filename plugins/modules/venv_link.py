#!/usr/bin/python
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: venv_link
short_description: Point a venv path, a symlink, at a complete venv built beside it, in one rename
version_added: 0.2.0
description:
  - A service runs from O(path), a symlink to a venv built beside it as C(<path>-<suffix>). A new venv is
    built under its own name while the service keeps running from the old one; this module then replaces
    the link with one C(rename(2)), so at every instant O(path) names a complete venv, and a build that
    failed never touches the running one.
  - The previous target is kept and named by C(<path>.previous) (the service runs from it until its restart,
    and a rollback needs no bundle); with O(remove_older), every other venv named C(<path>-*) is removed.
  - A service restarted later (by a handler) may still run from a venv older than the previous one, when an
    earlier run switched twice or failed before the restart. Switch with O(remove_older=false), restart the
    service, then call again with the same O(target) and O(remove_older=true) to remove what nothing runs from.
  - A directory at O(path) (a venv built in place) is moved aside once, as C(<path>-legacy), and kept as
    the previous one.
  - Changes nothing when O(path) already points at O(target).
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
    details: Says what it would switch and remove.
  diff_mode:
    support: full
    details: The link's target before and after.
options:
  path:
    description: The venv path the service uses, for example V(/opt/dcu-gateway/venv).
    type: path
    required: true
  target:
    description:
      - The complete venv to switch to, a directory beside O(path) named C(<path>-<suffix>) with a
        C(pyvenv.cfg).
      - In check mode it need not exist yet (the build it would come from is skipped too).
    type: path
    required: true
  remove_older:
    description:
      - Remove the venvs named C(<path>-*) other than O(target) and the previous one, also when the link points
        at O(target) already.
      - V(false) removes nothing (the service has not restarted onto O(target) yet).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Switch the gateway's venv to the one this bundle built
  dcu.serving.venv_link:
    path: /opt/dcu-gateway/venv
    target: /opt/dcu-gateway/venv-3f2a9c1b07de
    remove_older: false
  notify: Restart dcu-gateway

- name: Restart the gateway onto it
  ansible.builtin.meta: flush_handlers

- name: Remove the venvs the gateway no longer runs from (the previous one stays, for a rollback)
  dcu.serving.venv_link:
    path: /opt/dcu-gateway/venv
    target: /opt/dcu-gateway/venv-3f2a9c1b07de
"""

RETURN = r"""
previous:
  description: What O(path) pointed at before (a venv's name beside it), or null.
  returned: always
  type: str
  sample: venv-1b2c3d4e5f60
removed:
  description: The older venvs removed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: [/opt/dcu-gateway/venv-0a1b2c3d4e5f]
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule


def _replace_link(link, target):
    """rename(2) a fresh symlink over `link`: readers see the old target or the new one, never nothing."""
    scratch = link + ".new"
    if os.path.lexists(scratch):
        os.unlink(scratch)
    os.symlink(target, scratch)
    os.replace(scratch, link)


def _stale_venvs(path, keep):
    parent, name = os.path.split(path)
    for entry in sorted(os.listdir(parent) if os.path.isdir(parent) else []):  # none yet: check mode, first run
        full = os.path.join(parent, entry)
        if (entry.startswith(name + "-") and entry not in keep and not os.path.islink(full)
                and os.path.isfile(os.path.join(full, "pyvenv.cfg"))):
            yield full


def main():
    module = AnsibleModule(argument_spec=dict(
        path=dict(type="path", required=True),
        target=dict(type="path", required=True),
        remove_older=dict(type="bool", default=True),
    ), supports_check_mode=True)
    path = module.params["path"].rstrip("/")
    target = module.params["target"].rstrip("/")
    parent, name = os.path.split(path)
    new = os.path.basename(target)
    if os.path.dirname(target) != parent or not new.startswith(name + "-"):
        module.fail_json(msg="target %s must be beside path, named %s-<suffix>" % (target, path))
    if not module.check_mode and not os.path.isfile(os.path.join(target, "pyvenv.cfg")):
        module.fail_json(msg="target %s is not a complete venv (no pyvenv.cfg): build it first" % target)

    in_place = not os.path.islink(path) and os.path.isdir(path)
    if os.path.islink(path):
        previous = os.path.basename(os.readlink(path).rstrip("/"))
    elif in_place:
        previous = name + "-legacy"
    elif os.path.lexists(path):
        module.fail_json(msg="%s is a file, neither a venv nor a link to one: move it away" % path)
    else:
        previous = None
    if (not previous or previous == new) and os.path.islink(path + ".previous"):
        previous_kept = os.path.basename(os.readlink(path + ".previous"))
    else:
        previous_kept = previous
    removed = list(_stale_venvs(path, {new, previous_kept})) if module.params["remove_older"] else []
    if previous == new:
        if not module.check_mode:
            for stale in removed:
                shutil.rmtree(stale)
        module.exit_json(changed=bool(removed), previous=previous, removed=removed)

    if not module.check_mode:
        if in_place:
            os.rename(path, os.path.join(parent, previous))
        _replace_link(path, new)
        if previous:
            _replace_link(path + ".previous", previous)
        for stale in removed:
            shutil.rmtree(stale)
    module.exit_json(changed=True, previous=previous, removed=removed,
                     diff=dict(before="%s -> %s\n" % (path, previous or "(absent)"), after="%s -> %s\n" % (path, new)))


if __name__ == "__main__":
    main()
