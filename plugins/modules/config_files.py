#!/usr/bin/python
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: config_files
short_description: Put a set of directories and small files in place on the host in one call
version_added: 0.1.0
description:
  - Makes each listed directory exist and each listed file hold exactly the given content, with the given
    owner, group and mode, in one module call. A role with many small files (one environment file per vLLM
    instance, a unit, a helper script) pays one round trip to the host instead of two per file
    (M(ansible.builtin.template) and M(ansible.builtin.copy) each read the file's sum, then its attributes).
  - Content is rendered on the controller (for example with the P(ansible.builtin.template#lookup) lookup)
    and compared byte for byte with the file on the host; a file is rewritten only when its content differs,
    through a temporary file in the same directory and a rename, so a reader never sees half a file. The
    temporary file has the final owner, group and mode before it holds a byte (a new file holding a secret is
    never readable more widely than asked) and is flushed to disk before the rename, and the directory after it.
  - Owner, group and mode are set when they differ, whether or not the content changed.
  - Optionally reports the files in a directory that the set does not list (for example the environment
    files of instances no longer configured), so the caller can retire them.
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
    details: Reports what would change and changes nothing.
  diff_mode:
    support: full
    details: One diff per file whose content would change (content of a file with O(files[].no_log) is hidden).
requirements:
  - Only the Python standard library on the managed host.
seealso:
  - module: ansible.builtin.template
    description: One file per task, two module calls per file.
  - module: ansible.builtin.copy
    description: One file per task, two module calls per file.
options:
  directories:
    description: Directories to create, in order, before any file is written.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the directory.
        type: path
        required: true
      owner:
        description: Owner name.
        type: str
      group:
        description: Group name.
        type: str
      mode:
        description: Mode as an octal string, for example C("0755").
        type: raw
  files:
    description: Files to put in place.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the file. Its directory must exist (or be listed in O(directories)).
        type: path
        required: true
      content:
        description:
          - The exact content of the file.
          - Omitted with O(files[].state=touch).
        type: str
      state:
        description:
          - V(present) makes the file hold O(files[].content).
          - V(touch) creates an empty file when it is missing and never changes an existing file's content
            or times (a log file another process writes).
        type: str
        choices: [present, touch]
        default: present
      owner:
        description: Owner name.
        type: str
      group:
        description: Group name.
        type: str
      mode:
        description: Mode as an octal string, for example C("0644").
        type: raw
      validate:
        description:
          - A command run on the new content before it takes the file's place, with V(%s) standing for the
            temporary file's path (as M(ansible.builtin.template) does). A failing command fails the module,
            with its output, and leaves the old file.
        type: str
      return_previous:
        description: Return the file's content before this call as RV(files.previous) (for example to compare
          the old and new settings of a service).
        type: bool
        default: false
      no_log:
        description: Leave the content out of the diff (secrets).
        type: bool
        default: false
  unlisted:
    description:
      - Directories to look into for files that O(files) does not list; their paths are returned in RV(unlisted).
        Nothing is removed.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The directory.
        type: path
        required: true
      pattern:
        description: Shell pattern of the file names to consider, for example C(*.env).
        type: str
        default: "*"
"""

EXAMPLES = r"""
- name: Write the unit and one environment file per card
  dcu.serving.config_files:
    directories:
      - {path: /etc/dcu-serving/vllm, owner: root, group: root, mode: "0755"}
    files:
      - path: /etc/systemd/system/vllm@.service
        content: "{{ lookup('ansible.builtin.template', 'vllm@.service.j2') }}"
        owner: root
        group: root
        mode: "0644"
      - path: /etc/dcu-serving/vllm/0.env
        content: "DCU_VLLM_PORT=8001\n"
        mode: "0644"
    unlisted:
      - {path: /etc/dcu-serving/vllm, pattern: "*.env"}
  register: written

- name: Reload systemd when the unit changed
  ansible.builtin.systemd_service:
    daemon_reload: true
  when: written.files['/etc/systemd/system/vllm@.service'].changed
"""

RETURN = r"""
files:
  description: Each file of O(files), by path.
  returned: always
  type: dict
  contains:
    changed:
      description: Whether the content or an attribute changed (or would, in check mode).
      type: bool
    created:
      description: Whether the file did not exist before.
      type: bool
    content_changed:
      description: Whether the content changed (or would).
      type: bool
    previous:
      description: The content the file had before this call, with O(files[].return_previous) and when it existed.
      type: str
  sample: {"/etc/dcu-serving/vllm/0.env": {"changed": false, "created": false, "content_changed": false}}
directories:
  description: Each directory of O(directories), by path, with whether it changed.
  returned: always
  type: dict
  sample: {"/etc/dcu-serving/vllm": {"changed": false}}
unlisted:
  description: Files found under O(unlisted) that O(files) does not list, sorted.
  returned: always
  type: list
  elements: str
  sample: ["/etc/dcu-serving/vllm/7.env"]
"""

import fnmatch
import os
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native, to_text


def _fix_attributes(module, path, spec, diff):
    """Owner, group and mode: set where they differ (check mode: only tell). SELinux contexts are left alone."""
    args = {"path": path, "owner": spec.get("owner"), "group": spec.get("group"), "mode": spec.get("mode"),
            "attributes": None, "secontext": [None, None, None, None]}
    return module.set_fs_attributes_if_different(args, False, diff)


def _octal_mode(mode):
    """The mode as a number when it is given as one (0o640, "0640"), else None (absent, or symbolic: u=rw,g=r)."""
    if isinstance(mode, int):
        return mode
    if isinstance(mode, str) and mode.isdigit():
        return int(mode, 8)
    return None


def _directory(module, spec):
    path = spec["path"]
    changed = False
    if not os.path.isdir(path):
        if os.path.exists(path):
            module.fail_json(msg="%s exists and is not a directory" % path)
        changed = True
        if module.check_mode:
            return {"changed": True}
        # Closed (0700) until its owner and mode are set, when it has a mode of its own.
        if spec.get("mode") is None:
            os.makedirs(path)
        else:
            os.makedirs(path, 0o700)
    if _fix_attributes(module, path, spec, None):
        changed = True
    return {"changed": changed}


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def _take_attributes(module, tmp, path, spec):
    """The temporary file (0600 and root's, from mkstemp) gets the file's final owner, group and mode before it holds
    a byte: a process that opens it then keeps reading what it holds later, so it must never be wider than the final
    file (a new proxy.yml with the admin token, 0640). Attributes the spec leaves out come from the file it replaces
    (a new file: Ansible's default mode, 0666 less the umask)."""
    try:
        old = os.stat(path)
    except OSError:
        old = None
    if old is not None:
        os.chown(tmp, old.st_uid, old.st_gid)
    if _octal_mode(spec.get("mode")) is None:  # none given, or symbolic (relative to the old mode)
        if old is not None:
            os.chmod(tmp, stat.S_IMODE(old.st_mode))
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
    _fix_attributes(module, tmp, spec, None)


def _sync_directory(directory):
    """A rename is durable once its directory is on disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(module, spec, data):
    """The new content into a temporary file beside the target, created with the target's final owner, group and
    mode, flushed to disk, validated, then renamed over it and its directory flushed: a reader never sees half a
    file nor the file with a wider mode than asked, and after a crash the file is the old one or the new one, whole
    (ext4 and XFS may otherwise leave an empty file under the new name)."""
    path = spec["path"]
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            _take_attributes(module, tmp, path, spec)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if spec.get("validate"):
            if "%s" not in spec["validate"]:
                module.fail_json(msg="validate must contain %%s (the new file): %s" % spec["validate"])
            rc, out, err = module.run_command(spec["validate"] % tmp)
            if rc != 0:
                module.fail_json(msg="failed to validate %s: %s" % (path, (err or out).strip()), rc=rc,
                                 stdout=out, stderr=err)
        if module.selinux_enabled():
            # What atomic_move would do: the old file's context, or the policy's default for a new one.
            context = module.selinux_context(path) if os.path.exists(path) else module.selinux_default_context(path)
            module.set_context_if_different(tmp, context, False)
        os.rename(tmp, path)
        _sync_directory(directory)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _file(module, spec, diffs):
    path = spec["path"]
    state = spec.get("state") or "present"
    old = _read(path)
    result = {"changed": False, "created": old is None, "content_changed": False}
    if state == "touch":
        if old is None:
            result.update(changed=True, content_changed=True)
            if not module.check_mode:
                _write(module, dict(spec, validate=None), b"")
        if not (module.check_mode and old is None) and _fix_attributes(module, path, spec, None):
            result["changed"] = True
        return result
    if spec.get("content") is None:
        module.fail_json(msg="files: %s has no content (give content, or state: touch)" % path)
    new = to_bytes(spec["content"], errors="surrogate_or_strict")
    if spec.get("return_previous") and old is not None:
        result["previous"] = to_text(old, errors="surrogate_or_strict")
    if old != new:
        result.update(changed=True, content_changed=True)
        if module._diff:
            hidden = spec.get("no_log")
            diffs.append({"before_header": path, "after_header": path,
                          "before": "" if old is None else ("(hidden)\n" if hidden else to_text(old)),
                          "after": "(hidden)\n" if hidden else to_text(new)})
        if not module.check_mode:
            _write(module, spec, new)
    if module.check_mode and old is None:
        return result  # nothing to compare the attributes with
    if _fix_attributes(module, path, spec, None):
        result["changed"] = True
    return result


def _unlisted(specs, listed):
    found = []
    for spec in specs:
        directory, pattern = spec["path"], spec.get("pattern") or "*"
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            full = os.path.join(directory, name)
            if fnmatch.fnmatch(name, pattern) and os.path.isfile(full) and full not in listed:
                found.append(full)
    return sorted(found)


def main():
    attr = dict(owner=dict(type="str"), group=dict(type="str"), mode=dict(type="raw"))
    module = AnsibleModule(
        argument_spec=dict(
            directories=dict(type="list", elements="dict", default=[],
                             options=dict(path=dict(type="path", required=True), **attr)),
            files=dict(type="list", elements="dict", default=[],
                       options=dict(path=dict(type="path", required=True), content=dict(type="str", no_log=False),
                                    state=dict(type="str", choices=["present", "touch"], default="present"),
                                    validate=dict(type="str"), return_previous=dict(type="bool", default=False),
                                    no_log=dict(type="bool", default=False), **attr)),
            unlisted=dict(type="list", elements="dict", default=[],
                          options=dict(path=dict(type="path", required=True), pattern=dict(type="str", default="*"))),
        ),
        supports_check_mode=True,
    )
    for spec in module.params["directories"] + module.params["files"]:
        if not os.path.isabs(spec["path"]):
            module.fail_json(msg="%s: give an absolute path" % spec["path"])
    seen = set()
    for spec in module.params["files"]:
        if spec["path"] in seen:
            module.fail_json(msg="files: %s is listed twice" % spec["path"])
        seen.add(spec["path"])

    directories, files, diffs = {}, {}, []
    try:
        for spec in module.params["directories"]:
            directories[spec["path"]] = _directory(module, spec)
        for spec in module.params["files"]:
            if module.check_mode and not os.path.isdir(os.path.dirname(spec["path"])):
                files[spec["path"]] = {"changed": True, "created": True, "content_changed": True}
                continue
            files[spec["path"]] = _file(module, spec, diffs)
    except (IOError, OSError) as exc:
        module.fail_json(msg="cannot write %s: %s" % (getattr(exc, "filename", "") or "a file", to_native(exc)))

    changed = any(r["changed"] for r in directories.values()) or any(r["changed"] for r in files.values())
    result = dict(changed=changed, files=files, directories=directories,
                  unlisted=_unlisted(module.params["unlisted"], seen))
    if module._diff and diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
