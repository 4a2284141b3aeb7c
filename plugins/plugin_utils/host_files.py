# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The entries dcu.serving.config_files takes (a host's files and directories, one module call for all of them),
worked out from the roles' lists; and what the host's accounts say about a user."""

import posixpath


def directory_entries(paths, owner="root", group="root", mode="0755"):
    """[{path, owner, group, mode}] for config_files' `directories`, one per path, in order."""
    return [{"path": path, "owner": owner, "group": group, "mode": mode} for path in paths or []]


def env_file_entries(instances, directory, contents, owner="root", group="root", mode="0644"):
    """config_files' `files` entries of the instances' environment files, <directory>/<instance name>.env, with the
    content rendered for each (contents: {instance name: text}); each returns its previous content (a rollback)."""
    entries = []
    for instance in instances or []:
        name = str(instance["name"])
        entries.append({"path": posixpath.join(directory, name + ".env"), "content": contents[name], "owner": owner,
                        "group": group, "mode": mode, "return_previous": True})
    return entries


def previous_files(files, written):
    """The files to put back as they were before this run: each of `files` (config_files entries) whose content
    config_files changed (`written`: its result) and that existed before, with that earlier content."""
    done = (written or {}).get("files") or {}
    restore = []
    for entry in files or []:
        result = done.get(entry["path"]) or {}
        if result.get("content_changed") and "previous" in result:
            restore.append(dict(entry, content=result["previous"], return_previous=False))
    return restore


def member_groups(user, getent_group, getent_passwd):
    """The groups `user` belongs to: those listing it as a member, and its primary group (getent's databases as
    ansible.builtin.getent returns them: group {name: [password, gid, members]}, passwd {name: [.., uid, gid, ..]})."""
    primary = (getent_passwd or {}).get(user, [None, None, None])[2]
    return [name for name, fields in (getent_group or {}).items()
            if user in str(fields[2]).split(",") or fields[1] == primary]
