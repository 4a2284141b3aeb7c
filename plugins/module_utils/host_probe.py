# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Many small read-only looks at a host in one module call: paths' types and links, small files, commands'
output, getent databases. A converged host's run is mostly such looks; one round trip each adds up.
Used by the host_probe module and by dcu_facts (which adds them to its own reading of the cards)."""

import grp
import os
import stat as stat_module

# The options, in AnsibleModule's argument_spec form.
ARGUMENT_SPEC = {
    "stat": {"type": "list", "elements": "path", "default": []},
    "read": {"type": "list", "elements": "path", "default": []},
    "commands": {"type": "dict", "default": {}},
    "getent": {"type": "list", "elements": "str", "default": []},
}


def group_name(gid):
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return None


def stat_path(path):
    """exists, isdir, islnk, lnk_target, gr_name of path; its last component is not followed."""
    try:
        info = os.lstat(path)
    except OSError:
        return {"exists": False, "isdir": False, "islnk": False, "lnk_target": None, "gr_name": None}
    link = stat_module.S_ISLNK(info.st_mode)
    return {"exists": True, "isdir": stat_module.S_ISDIR(info.st_mode), "islnk": link,
            "lnk_target": os.readlink(path) if link else None, "gr_name": group_name(info.st_gid)}


def read_file(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def run_commands(module, commands):
    done = {}
    for name, argv in commands.items():
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            module.fail_json(msg="commands: {} must be a non-empty list of strings (argv), got {!r}".format(name, argv))
        try:
            rc, out, err = module.run_command(argv, handle_exceptions=False)
        except OSError as exc:  # not installed: the caller decides what that means
            rc, out, err = 127, "", "{}: {}".format(argv[0], exc.strerror)
        done[name] = {"rc": rc, "stdout": out, "stderr": err}
    return done


def getent(module, database):
    """{name: [other fields]}, as ansible.builtin.getent returns a whole database."""
    rc, out, err = module.run_command(["getent", database])
    if rc != 0:
        module.fail_json(msg="getent {} exited {}: {}".format(database, rc, (err or out).strip()))
    entries = {}
    for line in out.splitlines():
        fields = line.split(":")
        if fields and fields[0]:
            entries[fields[0]] = fields[1:]
    return entries


def probe(module):
    """(probe, facts) for module.params: {stat, read, commands} and {getent_<database>: ...}."""
    params = module.params
    found = {"stat": {path: stat_path(path) for path in params["stat"]},
             "read": {path: read_file(path) for path in params["read"]},
             "commands": run_commands(module, params["commands"])}
    facts = {"getent_" + database: getent(module, database) for database in params["getent"]}
    return found, facts
