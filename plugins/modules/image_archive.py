#!/usr/bin/python
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: image_archive
short_description: Load image tarballs into Docker or Podman only when the engine lacks them
version_added: 0.1.0
description:
  - Reads C(manifest.json) (C(docker save) format) or C(index.json) (OCI layout) inside the tarball,
    without loading it, to learn the image references and config digests it holds.
  - Compares them with what the engine has and loads the archive only when a reference is missing or
    points to a different image. Reports C(changed) only when it loaded something.
  - In check mode it reports what it would load. With C(--diff) it shows each reference's image id
    before and after.
  - Optionally verifies the tarball's SHA-256 first (against the bundle's C(index.json)), with the
    checksum cache of M(dcu.serving.bundle_artifact), so a re-run does not re-read a large tarball.
  - With the SHA-256 verified, what the tarball holds is remembered by that sum (C(image-archives.json) beside
    the checksum cache), so a re-run does not decompress a gzipped tarball to reach its C(manifest.json) either.
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
    details: Reports what it would load; the checksum cache is not written.
  diff_mode:
    support: full
    details: Each reference's image id before and after.
requirements:
  - The C(docker) or C(podman) command line on the managed host.
seealso:
  - module: dcu.serving.bundle_artifact
    description: Verifies any bundle artifact against its SHA-256 with the same cache.
  - module: community.docker.docker_image_load
    description: Loads an archive on every run and reports C(changed) each time.
options:
  path:
    description: The tarball on the managed host; plain or gzip-compressed.
    type: path
    required: true
  sha256:
    description:
      - Expected SHA-256 of the tarball, 64 hex digits. A different sum fails the task with file, expected
        and actual sums, before anything is loaded.
      - Empty or unset skips the verification.
    type: str
  engine:
    description: Container engine to load into.
    type: str
    choices: [docker, podman]
    default: docker
  executable:
    description: Path of the engine's command line. Defaults to O(engine) found on C(PATH).
    type: path
  force:
    description: Load even when the engine already has every image.
    type: bool
    default: false
  cache:
    description:
      - Checksum cache file (see M(dcu.serving.bundle_artifact)). An empty string disables it, and with it the
        memory of what each verified tarball holds.
    type: path
notes:
  - Unlike C(community.docker.docker_image_load) it does not report C(changed) on every run, has a real
    check mode, and returns every image of a multi-image archive.
"""

EXAMPLES = r"""
- name: Load the vLLM image from the staged bundle
  dcu.serving.image_archive:
    path: /var/lib/dcu-serving/bundle/images/vllm-0.11.0.tar
    sha256: "{{ artifact.sha256 }}"
  register: loaded

- name: Show what was loaded and what was already there
  ansible.builtin.debug:
    msg: "loaded {{ loaded.loaded }}, already there {{ loaded.already_loaded }}"
"""

RETURN = r"""
images:
  description: Every image in the archive with its state in the engine.
  returned: always
  type: list
  elements: dict
  sample:
    - {refs: ["dcu-serving/vllm-sim:0.11.0"], config_digest: "sha256:3f0e...", present: true}
loaded:
  description: References loaded by this run (or that would be, in check mode).
  returned: always
  type: list
  elements: str
already_loaded:
  description:
    - References the engine already had with the same config digest (not C(skipped), which Ansible
      reserves for a skipped task).
  returned: always
  type: list
  elements: str
checksum:
  description: Result of the SHA-256 verification, when O(sha256) was given.
  returned: when O(sha256) is set
  type: dict
  sample: {status: verified, cached: true, expected: "ab12...", actual: "ab12..."}
images_cached:
  description: Whether what the tarball holds came from the memory of an earlier run (by its verified SHA-256).
  returned: when O(sha256) is set and the cache is on
  type: bool
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils.checksum import ChecksumCache, default_cache_path, verify
from ansible_collections.dcu.serving.plugins.module_utils.image_archive import ArchiveError, cached_images, read_images


def engine_image_id(module, executable, ref):
    """The engine's id for ref (sha256:...), or None when it does not have it."""
    rc, out = module.run_command([executable, "image", "inspect", "--format", "{{.Id}}", ref])[:2]
    if rc != 0:
        return None
    image_id = out.strip()
    return image_id if image_id.startswith("sha256:") else "sha256:" + image_id


def state(module, executable, images):
    """{ref: id or None} for every reference in the archive (by digest for untagged images)."""
    return {ref: engine_image_id(module, executable, ref)
            for image in images for ref in (image["refs"] or [image["config_digest"]])}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            sha256=dict(type="str"),
            engine=dict(type="str", default="docker", choices=["docker", "podman"]),
            executable=dict(type="path"),
            force=dict(type="bool", default=False),
            cache=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]
    result = dict(changed=False, loaded=[], already_loaded=[], images=[])
    expected = (p["sha256"] or "").strip().lower()
    if expected and not re.match(r"^[0-9a-f]{64}$", expected):
        module.fail_json(msg="sha256 must be 64 hex digits (the image's sha256 in the bundle's index.json), got %r"
                             % p["sha256"], **result)
    if not os.path.isfile(path):
        module.fail_json(msg="image archive %s does not exist on the host: stage the bundle first" % path, **result)

    cache_path = None
    if expected:
        cache_path = default_cache_path() if p["cache"] is None else (p["cache"] or None)
        cache = ChecksumCache(cache_path, write=not module.check_mode)
        check = verify(path, expected, cache)
        result["checksum"] = check
        for warning in cache.warnings:
            module.warn(warning)
        if check["status"] != "verified":
            module.fail_json(msg="checksum mismatch for %s: expected sha256 %s, actual %s — the file is "
                                 "corrupt or not the one the bundle lists; copy it again from the bundle"
                                 % (path, check["expected"], check["actual"]), **result)

    executable = p["executable"] or module.get_bin_path(p["engine"], required=True)
    try:
        if expected and cache_path:
            store = os.path.join(os.path.dirname(cache_path), "image-archives.json")
            images, result["images_cached"] = cached_images(path, expected, store, write=not module.check_mode)
        else:
            images = read_images(path)
    except ArchiveError as exc:
        module.fail_json(msg=str(exc), **result)

    before = state(module, executable, images)
    wanted = {ref: image["config_digest"] for image in images for ref in (image["refs"] or [image["config_digest"]])}
    missing = sorted(ref for ref, digest in wanted.items() if before[ref] != digest)
    to_load = sorted(wanted) if p["force"] else missing
    result["loaded"] = to_load
    result["already_loaded"] = sorted(set(wanted) - set(to_load))
    result["images"] = [dict(image, present=all(before[r] == image["config_digest"]
                                                for r in (image["refs"] or [image["config_digest"]])))
                        for image in images]
    after = dict(before, **wanted) if to_load else before
    result["diff"] = dict(before="".join("%s %s\n" % (r, before[r] or "(absent)") for r in sorted(before)),
                          after="".join("%s %s\n" % (r, after[r]) for r in sorted(after)),
                          before_header="%s images" % p["engine"], after_header="%s images" % p["engine"])
    if not to_load:
        module.exit_json(**result)
    result["changed"] = True
    if module.check_mode:
        module.exit_json(**result)

    rc, out, err = module.run_command([executable, "load", "-i", path])
    if rc != 0:
        module.fail_json(msg="%s load -i %s failed (rc %s): %s" % (p["engine"], path, rc, (err or out).strip()),
                         **result)
    now = state(module, executable, images)
    wrong = sorted(ref for ref, digest in wanted.items() if now[ref] != digest)
    if wrong:
        module.fail_json(msg="after loading %s the engine still lacks %s (ids %s): the archive's manifest and its "
                             "content disagree" % (path, wrong, [now[r] for r in wrong]), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
