#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: bundle_join
short_description: Join the chunks of a bundle artifact on the host, hashing while it writes
version_added: 0.1.0
description:
  - Writes the chunks of a large artifact (role C(dcu_bundle) stages them under C(<stage dir>/.parts/<sha256>/))
    one after the other into C(<dest>.part), computing the SHA-256 of the bytes as they are written, so the
    joined file is not read again.
  - Only a file with the expected SHA-256 takes its name (C(<dest>.part) renamed to O(dest)); its sum then goes
    into the checksum cache of M(dcu.serving.bundle_artifact), which therefore reads nothing when it verifies
    the file next. The chunk directory is removed.
  - When the sum differs, C(<dest>.part) and the chunk directory are removed (a chunk was damaged; staging
    again sends every chunk) and the module fails naming both sums.
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
    details: Reports that the file would be joined; writes nothing.
  diff_mode:
    support: none
requirements:
  - Only the Python standard library on the managed host.
options:
  parts:
    description: The directory that holds the chunks.
    type: path
    required: true
  chunks:
    description: The chunk file names in O(parts), in the order their bytes go into the file.
    type: list
    elements: str
    required: true
  dest:
    description: The joined file. Its parent directory must exist.
    type: path
    required: true
  sha256:
    description: Expected SHA-256 of the joined file (64 hex digits, the artifact's C(sha256) in C(index.json)).
    type: str
    required: true
  name:
    description: Name of the artifact in messages, usually its C(file) in C(index.json). Defaults to O(dest).
    type: str
  mode:
    description: Permissions of the joined file.
    type: raw
    default: "0644"
  cache:
    description:
      - Path of the checksum cache file (the one M(dcu.serving.bundle_artifact) reads).
      - Defaults to C(/var/cache/dcu-serving/sha256-cache.json) for root and
        C(~/.cache/dcu-serving/sha256-cache.json) for other users. An empty string disables the cache.
    type: path
seealso:
  - module: dcu.serving.bundle_artifact
"""

EXAMPLES = r"""
- name: Join the chunks and put the file in place
  dcu.serving.bundle_join:
    parts: /var/lib/dcu-serving/bundle/.parts/{{ artifact.sha256 }}
    chunks: "{{ artifact.size | dcu.serving.bundle_chunks(536870912) }}"
    dest: /var/lib/dcu-serving/bundle/{{ artifact.file }}
    sha256: "{{ artifact.sha256 }}"
    name: "{{ artifact.file }}"
"""

RETURN = r"""
dest:
  description: The joined file.
  returned: always
  type: str
sha256:
  description: The SHA-256 of the joined bytes; null in check mode.
  returned: always
  type: str
size:
  description: Size of the joined file in bytes; null in check mode.
  returned: always
  type: int
"""

import hashlib
import os
import re
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils.checksum import CHUNK, ChecksumCache, default_cache_path


def join(parts, chunks, target):
    """Write the chunks into target in order; return (sha256 hex, size)."""
    digest = hashlib.sha256()
    size = 0
    with open(target, "wb") as out:
        for chunk in chunks:
            with open(os.path.join(parts, chunk), "rb") as handle:
                for block in iter(lambda: handle.read(CHUNK), b""):
                    digest.update(block)
                    out.write(block)
                    size += len(block)
    return digest.hexdigest(), size


def main():
    module = AnsibleModule(
        argument_spec={
            "parts": {"type": "path", "required": True},
            "chunks": {"type": "list", "elements": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "sha256": {"type": "str", "required": True},
            "name": {"type": "str"},
            "mode": {"type": "raw", "default": "0644"},
            "cache": {"type": "path"},
        },
        supports_check_mode=True,
    )
    params = module.params
    expected = params["sha256"].strip().lower()
    if not re.match(r"^[0-9a-f]{64}$", expected):
        module.fail_json(msg="sha256 must be 64 hex digits (the artifact's sha256 in index.json), got {!r}".format(
            params["sha256"]))
    name = params["name"] or params["dest"]
    parts, dest = params["parts"], params["dest"]
    result = {"changed": True, "dest": dest, "sha256": None, "size": None}
    missing = [c for c in params["chunks"] if not os.path.isfile(os.path.join(parts, c))]
    if missing:
        module.fail_json(msg="{}: chunks {} are missing in {}; stage again".format(name, ", ".join(missing), parts),
                         **result)
    if module.check_mode:
        module.exit_json(**result)

    partial = dest + ".part"
    try:
        actual, size = join(parts, params["chunks"], partial)
    except OSError as exc:
        module.fail_json(msg="{}: cannot join the chunks in {} into {}: {}".format(name, parts, partial, exc), **result)
    if actual != expected:
        os.unlink(partial)
        shutil.rmtree(parts, ignore_errors=True)
        module.fail_json(msg="{}: joined chunks have sha256 {}, expected {}; stage again".format(
            name, actual, expected), **result)
    module.set_mode_if_different(partial, params["mode"], False)
    os.rename(partial, dest)
    cache_path = default_cache_path() if params["cache"] is None else params["cache"] or None
    cache = ChecksumCache(cache_path)
    # The bytes were hashed as they were written: the next check of this file reads nothing.
    cache.remember(dest, actual)
    for warning in cache.warnings:
        module.warn(warning)
    shutil.rmtree(parts, ignore_errors=True)
    result.update(sha256=actual, size=size)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
