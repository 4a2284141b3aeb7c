#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: bundle_send
short_description: Send a large bundle artifact from the controller to the host in one pass, resumably
version_added: 0.1.0
description:
  - An action plugin (it runs on the controller) with this module as its host side. The ranges of
    O(chunk_mib) MiB of the controller's O(src) that the host does not already hold verified travel back to
    back through one remote command, a small Python receiver on the host that writes each at its offset of
    C(data) in the directory O(parts), hashes it as it writes, and appends C(<index> <sha256>) to
    C(progress-<range bytes>) beside it once the range is on disk (a thread syncs the file as it fills, so
    receiving does not wait for the disk). On the controller a thread reads the ranges a few blocks ahead of
    the sender, so reading overlaps sending. No chunk files on either side, so every byte is read once,
    crosses the connection once and is written once.
  - The one command is the connection's own (the ssh command with its options and control socket,
    C(docker exec -i) of community.docker.docker, or a local shell), with its stdin fed as the file is read.
    With another connection, or when ssh or become waits for a password, each range goes through the
    connection's exec_command with its bytes as input (one range in memory at a time).
  - The receiver reports every range's SHA-256 at the end. Range sums are trusted only once seen to make
    the artifact's sum, and are then remembered beside the controller's checksum cache, keyed by the artifact's
    sum and the range size. A first send of the whole file hashes nothing on the controller; the receiver
    hashes the whole file too as it writes it, and when that is O(sha256) its range sums are the ones
    remembered. With sums remembered (the next host), each range's sum on the host is compared with them. A
    range whose sum differs is sent once more, then the task fails naming both sums; a whole that is not
    O(sha256) makes the controller hash its file once, to find the ranges to send again.
  - A range the progress file lists with the right sum is not sent again, so an interrupted transfer resumes;
    a range cut short is never listed. To know which listed sums are right when it has none remembered, the
    controller then hashes its file once first.
  - Once every range is there, the file takes its name O(dest) only when it has O(sha256). When every range
    was sent in this run, each was hashed on the host as it was written and matched sums that make O(sha256)
    (or the whole was), so the file is not read again; when some ranges are from an
    earlier run (they waited on disk), the host hashes the whole file once. The sum then goes into the
    checksum cache of M(dcu.serving.bundle_artifact), which therefore reads nothing when it verifies the file
    next. The O(parts) directory is removed. When the sum differs, that directory is removed (the next run
    sends every range) and the task fails naming both sums.
  - When O(dest) already holds the verified file (the checksum cache answers), nothing is sent.
  - Receiver and host side need only the Python standard library (Python 2.7 or 3.6 and later).
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
    details: Reports which ranges would be sent; sends and writes nothing.
  diff_mode:
    support: none
  action:
    description: Runs on the controller (reads O(src) there) and on the host.
    support: full
requirements:
  - Only the Python standard library on the managed host.
options:
  src:
    description: The artifact on the controller.
    type: path
    required: true
  dest:
    description: Where the artifact goes on the host. Its parent directory must exist.
    type: path
    required: true
  sha256:
    description: Expected SHA-256 of the artifact (64 hex digits, its C(sha256) in C(index.json)).
    type: str
    required: true
  chunk_mib:
    description: Size of a range in MiB, the unit that is sent, checked and resumed.
    type: int
    default: 512
  parts:
    description:
      - The directory that holds the file while it arrives (its C(data) and C(progress-<range bytes>)); on the
        file system of O(dest), which the file is renamed to. Removed once the file is in place.
      - Defaults to C(<dest dir>/.parts/<sha256>).
    type: path
  name:
    description: Name of the artifact in messages, usually its C(file) in C(index.json). Defaults to O(dest).
    type: str
  mode:
    description: Permissions of the file on the host.
    type: raw
    default: "0644"
  cache:
    description:
      - Path of the host's checksum cache file (the one M(dcu.serving.bundle_artifact) reads).
      - Defaults to C(/var/cache/dcu-serving/sha256-cache.json) for root and
        C(~/.cache/dcu-serving/sha256-cache.json) for other users. An empty string disables the cache.
    type: path
  phase:
    description:
      - Internal, set by the action plugin when it runs the module on the host; not for playbooks.
      - V(status) reports the ranges the host holds (and creates the scratch directory outside check mode);
        V(finish) checks the whole file and puts it in place.
    type: str
    choices: [status, finish]
    default: status
  size:
    description: Internal, set by the action plugin; the size of O(src) in bytes.
    type: int
  hashed:
    description:
      - Internal, set by the action plugin in phase V(finish) when every range was sent in this run, hashed on
        the host as it was written and found equal to range sums that make O(sha256), so the file is then not
        read again.
    type: bool
    default: false
seealso:
  - module: dcu.serving.bundle_artifact
"""

EXAMPLES = r"""
- name: Send a large artifact the host lacks
  dcu.serving.bundle_send:
    src: /srv/bundle/{{ artifact.file }}
    dest: /var/lib/dcu-serving/bundle/{{ artifact.file }}
    sha256: "{{ artifact.sha256 }}"
    chunk_mib: 512
    parts: /var/lib/dcu-serving/bundle/.parts/{{ artifact.sha256 }}
    name: "{{ artifact.file }}"
"""

RETURN = r"""
dest:
  description: The file on the host.
  returned: always
  type: str
sha256:
  description: The SHA-256 of the file on the host; null in check mode when ranges would be sent.
  returned: always
  type: str
ranges:
  description:
    - One entry per range of the artifact, in order, with its C(index), C(offset), C(size), C(sha256) (null
      when not known, in check mode) and C(status) - V(sent), V(present) (the host held it, not sent),
      V(to send) (check mode) or V(in place) (the whole file was already there).
  returned: always
  type: list
  elements: dict
sent:
  description: Indices of the ranges sent (in check mode, that would be sent).
  returned: always
  type: list
  elements: int
"""

import errno
import os
import re
import shutil
import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils.bundle_send import TASK_ARGUMENT_SPEC
from ansible_collections.dcu.serving.plugins.module_utils.checksum import (
    ChecksumCache,
    default_cache_path,
    sha256_file,
    verify,
)

SUM = re.compile(r"^[0-9a-f]{64}$")


def scratch(dest, sha256, parts=None):
    """The directory that holds a file while it arrives, and its data file."""
    parts = parts or os.path.join(os.path.dirname(dest), ".parts", sha256)
    return parts, os.path.join(parts, "data")


def progress_path(parts, chunk_bytes):
    return os.path.join(parts, "progress-%d" % chunk_bytes)


def read_progress(path):
    """{index: sha256} from a progress file of `<index> <sha256>` lines; the last line of an index wins,
    lines that are not whole (an interrupted append) are ignored."""
    held = {}
    try:
        with open(path) as handle:
            text = handle.read()
    except (IOError, OSError) as exc:
        if exc.errno == errno.ENOENT:
            return held
        raise
    for line in text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]:
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit() and SUM.match(fields[1]):
            held[int(fields[0])] = fields[1]
    return held


def main():
    module = AnsibleModule(
        argument_spec=dict(
            TASK_ARGUMENT_SPEC,
            phase={"type": "str", "choices": ["status", "finish"], "default": "status"},
            size={"type": "int"},
            hashed={"type": "bool", "default": False},
        ),
        supports_check_mode=True,
    )
    params = module.params
    expected = params["sha256"].strip().lower()
    if not SUM.match(expected):
        module.fail_json(msg="sha256 must be 64 hex digits (the artifact's sha256 in index.json), got {0!r}".format(
            params["sha256"]))
    dest = params["dest"]
    name = params["name"] or dest
    chunk_bytes = params["chunk_mib"] * 1048576
    parts, data = scratch(dest, expected, params["parts"])
    progress = progress_path(parts, chunk_bytes)
    cache_path = default_cache_path() if params["cache"] is None else params["cache"] or None
    cache = ChecksumCache(cache_path, write=not module.check_mode)
    result = {"changed": False, "dest": dest, "parts": parts, "data": data, "progress": progress}

    if params["phase"] == "status":
        if verify(dest, expected, cache)["status"] == "verified":
            for warning in cache.warnings:
                module.warn(warning)
            module.exit_json(in_place=True, **result)
        held = read_progress(progress) if os.path.isfile(data) else {}
        if not module.check_mode:
            if not os.path.isdir(parts):
                os.makedirs(parts, 0o700)
            if not held:
                # Nothing the host holds counts: start the data file afresh.
                with open(data, "wb"):
                    pass
                os.chmod(data, 0o600)
                if os.path.exists(progress):
                    os.unlink(progress)
        module.exit_json(in_place=False, held=dict((str(k), v) for k, v in held.items()),
                         python=sys.executable, **result)

    # finish: every range is there; the whole file is hashed once and takes its name only when it verifies.
    result["changed"] = True
    if module.check_mode:
        module.exit_json(**result)
    try:
        size = os.stat(data).st_size
        if params["size"] is not None and size > params["size"]:
            with open(data, "r+b") as handle:
                handle.truncate(params["size"])
        actual = expected if params["hashed"] else sha256_file(data)
    except OSError as exc:
        module.fail_json(msg="{0}: cannot read {1}: {2}".format(name, data, exc), **result)
    if actual != expected:
        shutil.rmtree(parts, ignore_errors=True)
        module.fail_json(msg="{0}: the file sent has sha256 {1}, expected {2}; stage again".format(
            name, actual, expected), **dict(result, sha256=actual))
    module.set_mode_if_different(data, params["mode"], False)
    os.rename(data, dest)
    # The file was hashed just now: the next check of it reads nothing.
    cache.remember(dest, actual)
    for warning in cache.warnings:
        module.warn(warning)
    shutil.rmtree(parts, ignore_errors=True)
    module.exit_json(**dict(result, sha256=actual))


if __name__ == "__main__":
    main()
