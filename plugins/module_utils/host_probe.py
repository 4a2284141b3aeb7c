# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Many small read-only looks at a host in one module call: paths' types and links, small files, commands'
output, getent databases. A converged host's run is mostly such looks; one round trip each adds up.
Used by the host_probe module and by dcu_facts (which adds them to its own reading of the cards).

With host_facts, the facts every role decides by are read and parsed here, once: systemd's version and the
container engine's (docker's server version), returned as ansible_facts.dcu_host. A role asks for them only
while the host has none (`host_facts: "{{ ansible_facts.dcu_host is undefined }}"`), so the first look of a play
reads them and the others reuse them."""

import grp
import os
import re
import stat as stat_module

from ansible_collections.dcu.serving.plugins.module_utils import container_engine

# The options, in AnsibleModule's argument_spec form.
ARGUMENT_SPEC = {
    "stat": {"type": "list", "elements": "path", "default": []},
    "read": {"type": "list", "elements": "path", "default": []},
    "commands": {"type": "dict", "default": {}},
    "getent": {"type": "list", "elements": "str", "default": []},
    "host_facts": {"type": "bool", "default": False},
    "engine": {"type": "str", "default": "docker"},
}

# `systemctl --version`'s first line: "systemd 219", "systemd 252 (252.36-1~deb12u1)".
_SYSTEMD = re.compile(r"^systemd\s+(\d+)")
# The engine's server version: what the daemon that runs the containers is, not the client.
ENGINE_VERSION_FORMAT = "{{.Server.Version}}"


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
    if params["host_facts"]:
        facts["dcu_host"] = host_facts(module, params["engine"])
    return found, facts


def systemd_version(text):
    """systemd's version as a number from `systemctl --version`, or None when the text is not systemd's."""
    match = _SYSTEMD.match((text or "").strip())
    return int(match.group(1)) if match else None


def engine_version(text):
    """{version, version_tuple} of a container engine from its version text: '18.09.0' -> '18.9.0', [18, 9, 0]
    (leading zeros dropped, so both compare as versions and as lists); None when no version is in it."""
    lines = (text or "").strip().splitlines()
    parts = container_engine.parse_version(lines[0]) if lines else None
    if not parts:
        return None
    return {"version": ".".join(str(part) for part in parts), "version_tuple": list(parts)}


def selinux_mode(done):
    """'enforcing', 'permissive' or 'disabled' from `getenforce` (libselinux-utils, on every EL and Kylin host
    with SELinux); a host without the command has no SELinux (Debian, Ubuntu)."""
    word = done["stdout"].strip().lower() if done["rc"] == 0 else ""
    return word if word in ("enforcing", "permissive") else "disabled"


def host_facts(module, engine="docker"):
    """ansible_facts.dcu_host: systemd's version and the container engine's, parsed, and SELinux's mode; what
    could not be read is null, with the reason (no engine at all is an answer, not a failure)."""
    done = run_commands(module, {"systemd": ["systemctl", "--version"],
                                 "engine": [engine, "version", "--format", ENGINE_VERSION_FORMAT],
                                 "selinux": ["getenforce"]})
    systemd, answer = done["systemd"], done["engine"]
    version = systemd_version(systemd["stdout"]) if systemd["rc"] == 0 else None
    found = engine_version(answer["stdout"]) if answer["rc"] == 0 else None
    why = (answer["stderr"] or answer["stdout"]).strip() or "exit code {}".format(answer["rc"])
    return {
        "selinux": selinux_mode(done["selinux"]),
        "systemd_version": version,
        "systemd_error": None if version is not None else (
            (systemd["stderr"] or systemd["stdout"]).strip() or "exit code {}".format(systemd["rc"])),
        "engine": {
            "name": os.path.basename(engine),
            "present": answer["rc"] != 127,
            "version": found["version"] if found else None,
            "version_tuple": found["version_tuple"] if found else None,
            "raw": answer["stdout"].strip() if answer["rc"] == 0 else None,
            "error": None if found else why,
        },
    }
