#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: bundle_verify
short_description: Verify a whole offline bundle directory and return its index
version_added: 0.1.0
description:
  - Checks an offline bundle directory the way C(dcu-bundle verify) does, with only the standard library,
    so a user who installed nothing but this collection can check a bundle before staging it.
  - Every artifact C(index.json) lists must be present with its size and SHA-256; C(SHA256SUMS) must agree
    with C(index.json); no other file may be in the directory (C(.part) and C(.tmp) files are named as left
    by an interrupted build). All problems are reported, not just the first.
  - Sums are cached by (path, size, modification time) in the same cache as M(dcu.serving.bundle_artifact)
    and C(dcu-bundle), so a re-run does not re-read multi-GB image tarballs that did not change.
  - Run it where the bundle is, usually the controller (a play on C(localhost), or C(delegate_to=localhost)).
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
options:
  path:
    description: The bundle directory, the one that holds C(index.json) and C(SHA256SUMS).
    type: path
    required: true
  strict:
    description:
      - Fail when the bundle has any problem; the message lists each one with the file.
      - With V(false) the problems are returned (O(strict=false) to report them yourself).
    type: bool
    default: true
  cache:
    description:
      - Path of the checksum cache file.
      - Defaults to C(/var/cache/dcu-serving/sha256-cache.json) for root and
        C(~/.cache/dcu-serving/sha256-cache.json) for other users.
      - An empty string disables the cache (every byte is read again).
    type: path
notes:
  - The module never changes the bundle; the cache is the only thing it writes, and not in check mode.
seealso:
  - module: dcu.serving.bundle_artifact
"""

EXAMPLES = r"""
- name: Refuse a bundle that does not verify, and read its index
  dcu.serving.bundle_verify:
    path: "{{ dcu_bundle_dir }}"
  delegate_to: localhost
  run_once: true
  register: bundle

- name: Stage every artifact
  ansible.builtin.debug:
    msg: "{{ bundle.artifacts | length }} artifacts, {{ bundle.size | human_readable }}"
"""

RETURN = r"""
ok:
  description: Whether the bundle verified (no problem at all).
  returned: always
  type: bool
problems:
  description:
    - Each problem, with the file (relative to the bundle), its kind (V(missing), V(size), V(mismatch),
      V(unlisted), V(sums), V(index)) and a detail naming both sums or sizes where they differ.
  returned: always
  type: list
  elements: dict
  sample: [{"file": "images/vllm.tar", "problem": "mismatch", "detail": "expected sha256 ab.., actual cd.."}]
artifacts:
  description:
    - The artifacts of C(index.json) (C(name), C(kind), C(version), C(file), C(sha256), C(size), ...).
    - Empty when the index is unreadable.
  returned: always
  type: list
  elements: dict
size:
  description: The artifacts' total size in bytes.
  returned: always
  type: int
bundle:
  description: The bundle directory that was checked.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils.bundle_index import verify
from ansible_collections.dcu.serving.plugins.module_utils.checksum import ChecksumCache, default_cache_path


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "strict": {"type": "bool", "default": True},
            "cache": {"type": "path"},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    cache_path = default_cache_path() if module.params["cache"] is None else module.params["cache"] or None
    cache = ChecksumCache(cache_path, write=not module.check_mode)
    try:
        index, problems = verify(path, cache)
    except OSError as exc:
        module.fail_json(msg="cannot read the bundle {}: {}; check the path and the permissions".format(path, exc))
    for warning in cache.warnings:
        module.warn(warning)
    artifacts = index["artifacts"] if index else []
    result = {"changed": False, "ok": not problems, "problems": problems, "artifacts": artifacts,
              "size": sum(a["size"] for a in artifacts), "bundle": path}
    if problems and module.params["strict"]:
        lines = ["{}: {} ({})".format(p["file"], p["problem"], p["detail"]) for p in problems]
        module.fail_json(
            msg="{} does not verify, {} problem(s): {}. Build it again (ansible-playbook dcu.serving.bundle "
                "-i <inventory> on the staging machine) or copy it again from an intact bundle.".format(
                    path, len(problems), "; ".join(lines)),
            **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
