#!/usr/bin/python
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: bundle_artifact
short_description: Verify offline-bundle artifacts on the host against their SHA-256
version_added: 0.1.0
description:
  - Computes the SHA-256 of a file on the managed host and compares it with the sum the bundle's
    C(index.json) gives for that artifact.
  - Reports whether the file is present and verified, missing, or different (mismatch), with the
    file, the expected and the actual sum. Never changes the file.
  - With O(artifacts), every artifact of a list in one call, reported in RV(results) as a loop would register
    them. One round trip to the host instead of one per file (153 files of the demo bundle took 50 s one by one
    over the docker connection).
  - Sums are cached by (path, size, modification time), so a re-run does not re-read multi-GB files
    that did not change. The cache is the only thing the module writes; it is not written in check mode.
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
    details: Never changes the file; the checksum cache is not written in check mode.
  diff_mode:
    support: none
requirements:
  - Only the Python standard library on the managed host.
seealso:
  - module: dcu.serving.image_archive
    description: Verifies an image tarball with the same checksum cache before loading it.
  - module: ansible.builtin.stat
    description: Returns a file's checksum too, but reads the whole file on every run.
options:
  path:
    description:
      - Path of the artifact on the managed host.
      - Required unless O(artifacts) is given.
    type: path
  sha256:
    description:
      - Expected SHA-256 (64 hex digits), for example the C(sha256) of the artifact in C(index.json).
      - Required with O(path).
    type: str
  artifacts:
    description:
      - Instead of O(path) and O(sha256), a list of C(index.json) entries (each with C(file) and C(sha256)), checked
        at O(directory)/C(file).
    type: list
    elements: dict
  directory:
    description: Where the O(artifacts) are on the managed host. Required with O(artifacts).
    type: path
  name:
    description:
      - Name of the artifact in messages, usually its C(file) in C(index.json) (C(driver/rock-6.3.30-V1.4.1a.run)).
      - Defaults to O(path); with O(artifacts), each one's C(file).
    type: str
  strict:
    description:
      - Fail unless the file is present and verified; the message names the file, expected and actual sums (with
        O(artifacts), of every one that is not).
      - With V(false) a missing or different file is reported, not a failure (to decide whether to copy it).
    type: bool
    default: false
  cache:
    description:
      - Path of the checksum cache file.
      - Defaults to C(/var/cache/dcu-serving/sha256-cache.json) for root and
        C(~/.cache/dcu-serving/sha256-cache.json) for other users.
      - An empty string disables the cache.
    type: path
notes:
  - The cache trusts size and modification time, like C(make) and C(rsync) do; a tool that rewrites a
    file keeping both would defeat it. Remove the cache file to force a full re-hash.
"""

EXAMPLES = r"""
- name: Check whether the host already holds the verified installer
  dcu.serving.bundle_artifact:
    path: /var/lib/dcu-serving/bundle/driver/rock-6.3.30-V1.4.1a.run
    sha256: "{{ artifact.sha256 }}"
    name: "{{ artifact.file }}"
  register: installer

- name: Use a staged file only when it is the one the bundle names
  dcu.serving.bundle_artifact:
    path: /srv/bundle/dtk/DTK-26.04-Debian12-x86_64.tar.gz
    sha256: 0f3c...e1
    strict: true

- name: Check in one call which of the bundle's artifacts the host holds
  dcu.serving.bundle_artifact:
    artifacts: "{{ (lookup('ansible.builtin.file', 'bundle/index.json') | from_json).artifacts }}"
    directory: /var/lib/dcu-serving/bundle
  register: staged
  # staged.results | rejectattr('verified') | map(attribute='item'): the entries to copy
"""

RETURN = r"""
status:
  description: V(verified) (present, same sum), V(missing), or V(mismatch) (present, different sum).
  returned: always
  type: str
  sample: verified
verified:
  description: Whether O(path) is present and has the expected sum.
  returned: always
  type: bool
path:
  description: The file that was checked.
  returned: always
  type: str
name:
  description: The artifact's name as given (or the path).
  returned: always
  type: str
expected:
  description: The expected SHA-256, lower case.
  returned: always
  type: str
actual:
  description: The file's SHA-256; null when the file is missing.
  returned: always
  type: str
size:
  description: File size in bytes; null when the file is missing.
  returned: always
  type: int
cached:
  description: Whether the sum came from the cache instead of reading the file.
  returned: always
  type: bool
results:
  description:
    - With O(artifacts), one entry per artifact, in order, each with the keys above and C(item), the artifact as
      given (the shape of a registered loop).
  returned: when O(artifacts) is set
  type: list
  elements: dict
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils.bundle_index import file_problem
from ansible_collections.dcu.serving.plugins.module_utils.checksum import ChecksumCache, default_cache_path, verify


def check(module, cache, path, sha256, name):
    """bundle_artifact's result for one file: its status, its sums, whether it is verified."""
    expected = (sha256 or "").strip().lower()
    if not re.match(r"^[0-9a-f]{64}$", expected):
        module.fail_json(msg="sha256 of {} must be 64 hex digits (the artifact's sha256 in index.json), got {!r}"
                         .format(name, sha256))
    try:
        result = verify(path, expected, cache)
    except OSError as exc:
        module.fail_json(msg="cannot read {} ({}): {}; check the path and the permissions".format(
            name, path, exc.strerror))
    result.update(name=name, verified=result["status"] == "verified")
    return result


def failure(result):
    if result["status"] == "missing":
        return "{} is missing at {}; stage the bundle again".format(result["name"], result["path"])
    return ("checksum mismatch for {}: expected sha256 {}, actual {} ({}); the file is corrupt or not the one "
            "index.json names, replace it from an intact bundle".format(
                result["name"], result["expected"], result["actual"], result["path"]))


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path"},
            "sha256": {"type": "str"},
            "name": {"type": "str"},
            "artifacts": {"type": "list", "elements": "dict"},
            "directory": {"type": "path"},
            "strict": {"type": "bool", "default": False},
            "cache": {"type": "path"},
        },
        required_one_of=[("path", "artifacts")],
        mutually_exclusive=[("path", "artifacts"), ("name", "artifacts")],
        required_together=[("path", "sha256"), ("artifacts", "directory")],
        supports_check_mode=True,
    )
    params = module.params
    cache_path = default_cache_path() if params["cache"] is None else params["cache"] or None
    cache = ChecksumCache(cache_path, write=not module.check_mode)
    if params["artifacts"] is None:
        results = [check(module, cache, params["path"], params["sha256"], params["name"] or params["path"])]
    else:
        results = []
        for artifact in params["artifacts"]:
            name = artifact.get("file")
            problem = file_problem(name, artifact.get("kind"))  # the bundle format's own rule: inside, plain
            if problem:
                module.fail_json(msg="every entry of artifacts needs a file, a relative path inside directory as in "
                                     "index.json: {!r} {}".format(name, problem))
            path = os.path.join(params["directory"], name)
            results.append(dict(check(module, cache, path, artifact.get("sha256"), name), item=artifact))
    for warning in cache.warnings:
        module.warn(warning)
    bad = [r for r in results if not r["verified"]]
    if params["artifacts"] is None:
        if params["strict"] and bad:
            module.fail_json(msg=failure(bad[0]), changed=False, **bad[0])
        module.exit_json(changed=False, **results[0])
    if params["strict"] and bad:
        module.fail_json(msg="{} of {} artifacts do not verify: {}".format(
            len(bad), len(results), "; ".join(failure(r) for r in bad)), changed=False, results=results)
    module.exit_json(changed=False, results=results)


if __name__ == "__main__":
    main()
