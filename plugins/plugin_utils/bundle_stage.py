# Copyright: dcu-serving contributors
# Apache License 2.0 (see the collection's LICENSE)
"""Staging an offline bundle on a host (role dcu_bundle, tasks/stage.yml): where each artifact is, which
directories it needs, and what a staged copy holds that the bundle
no longer lists."""

import posixpath

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.text.formatters import bytes_to_human

# Where a host keeps a large artifact while it arrives (dcu.serving.bundle_send): <stage dir>/.parts/<sha256>/.
PARTS = ".parts"
# Files of a staged bundle that are not artifacts.
BUNDLE_FILES = ("index.json", "SHA256SUMS")


def bundle_staged(checks, directory, check_mode=False):
    """[{artifact, path, ready}] from bundle_artifact's loop results (each with `item`, an index.json entry,
    and `verified`) for artifacts that are (or are now) in `directory` on the host.

    ready is false only in check mode for an artifact that was not verified there (it would have been copied).
    """
    staged = []
    for check in checks or []:
        artifact = check["item"]
        staged.append({
            "artifact": artifact,
            "path": posixpath.join(directory, artifact["file"]),
            "ready": bool(check.get("verified")) or not check_mode,
        })
    return staged


def bundle_stage_dirs(artifacts, directory):
    """The directories the artifacts go to under `directory`, the directory itself first."""
    dirs = [directory.rstrip("/") or "/"]
    for artifact in artifacts or []:
        parent = posixpath.dirname(artifact["file"])
        path = posixpath.join(dirs[0], parent) if parent else dirs[0]
        if path not in dirs:
            dirs.append(path)
    return dirs


def bundle_unlisted(paths, directory, artifacts):
    """What a staged copy of the bundle holds that the bundle does not list: the paths to remove.

    paths: every file under `directory` (ansible.builtin.find, recursive, hidden). index.json, SHA256SUMS and
    the artifacts stay; so does the scratch of an artifact still listed (an interrupted transfer resumes from
    it). The scratch directory of an artifact no longer listed goes as a whole.
    """
    root = directory.rstrip("/")
    keep = set(BUNDLE_FILES) | set(a["file"] for a in artifacts or [])
    sums = set(a["sha256"] for a in artifacts or [])
    remove = []
    for path in paths or []:
        rel = posixpath.relpath(path, root)
        if rel.startswith("../") or rel == "..":
            raise AnsibleFilterError("bundle_unlisted: {} is not under {}".format(path, root))
        if rel in keep:
            continue
        parts = rel.split("/")
        if parts[0] == PARTS and len(parts) > 2:
            if parts[1] in sums:
                continue
            rel = posixpath.join(PARTS, parts[1])
        target = posixpath.join(root, rel)
        if target not in remove:
            remove.append(target)
    return sorted(remove)


def bundle_changes(outcomes):
    """One line per artifact playbooks/bundle.yml built or fetched (not those it kept): action, size, seconds, file."""
    return ["%-10s %10s %6.1fs  %s" % (o["action"], bytes_to_human(o["size"]), o["seconds"], o["file"])
            for o in outcomes or [] if o.get("action") != "kept"]


def bundle_debs_to_install(debs, dpkg_lines):
    """The bundle's Debian packages (index.json entries of kind deb) that are not fully installed at their version,
    from `dpkg-query --show --showformat='${Package} ${Version} ${db:Status-Abbrev}\\n'` over them: a package at
    another version, half-installed or removed with its configuration left (rc) is installed again."""
    installed = {}
    for line in dpkg_lines or []:
        fields = line.split()
        if len(fields) >= 3 and fields[2].startswith("ii"):
            installed[fields[0]] = fields[1]
    return [deb for deb in debs or [] if installed.get(deb["name"]) != deb["version"]]
