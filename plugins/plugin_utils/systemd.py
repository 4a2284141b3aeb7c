# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Units that work on the oldest systemd a DCU host runs.

DCU hosts run CentOS 7.6 (systemd 219), Kylin V10 and openEuler 20.03 (243), Ubuntu 20.04 (245) and newer.
An old systemd ignores a directive it does not know with a warning, and a value it does not know
(Type=exec, ProtectSystem=strict) with nothing at all: the unit silently loses that protection or
behaviour. systemd_compatible rewrites a rendered unit for the host's version: directives newer than it are
replaced by their older spelling where one exists (CPUWeight -> CPUShares, ReadWritePaths ->
ReadWriteDirectories, ProtectSystem=strict -> full, Type=exec -> simple) and dropped otherwise. Versions
are from systemd's NEWS and man pages (systemd.directives(7)).
"""

import re

from ansible.errors import AnsibleFilterError

# directive (or directive=value) -> (first systemd version that knows it, replacement for older ones or None)
SINCE = {
    "Type=exec": (240, "Type=simple"),
    "ProtectSystem=strict": (232, "ProtectSystem=full"),
    "ReadWritePaths": (231, "ReadWriteDirectories"),
    "ReadOnlyPaths": (231, "ReadOnlyDirectories"),
    "CPUWeight": (231, "CPUShares"),
    "AmbientCapabilities": (229, None),
    "MemoryDenyWriteExecute": (231, None),
    "RestrictRealtime": (231, None),
    "MemoryMax": (231, "MemoryLimit"),
    "TasksMax": (227, None),
    "IPAddressAllow": (235, None),
    "IPAddressDeny": (235, None),
    "PrivateMounts": (239, None),
    "ProtectKernelTunables": (232, None),
    "ProtectKernelModules": (232, None),
    "ProtectControlGroups": (232, None),
    "RemoveIPC": (232, None),
    "RestrictNamespaces": (233, None),
    "LockPersonality": (235, None),
    "RestrictSUIDSGID": (242, None),
    "ProtectHostname": (242, None),
    "NUMAPolicy": (243, None),
    "NUMAMask": (243, None),
    "ProtectKernelLogs": (244, None),
    "ProtectClock": (245, None),
    "ProtectProc": (247, None),
    "ProcSubset": (247, None),
    "RestartSteps": (254, None),
    "RestartMaxDelaySec": (254, None),
}
# @system-service arrived in 231; older hosts get no system call filter rather than a broken one.
SYSCALL_GROUPS = (231, None)
# The start limit moved from [Service] (StartLimitInterval=) to [Unit] (StartLimitIntervalSec=) in 230.
START_LIMIT_IN_UNIT = 230


def _convert(directive, value):
    """CPUWeight 800 (of 100) is CPUShares 8192 (of 1024): the same share of the CPU."""
    if directive == "CPUWeight":
        return str(int(value) * 1024 // 100)
    return value


def systemd_compatible(unit, version):
    """The unit text with every directive the host's systemd `version` does not know rewritten or dropped."""
    try:
        version = int(str(version).strip())
    except (TypeError, ValueError):
        raise AnsibleFilterError("systemd_compatible: {!r} is not a systemd version".format(version)) from None
    out, moved, service_at = [], [], None
    for line in unit.splitlines():
        stripped = line.strip()
        if stripped == "[Service]":
            service_at = len(out) + 1
        if "=" not in stripped or stripped.startswith(("#", ";", "[")):
            out.append(line)
            continue
        directive, value = stripped.split("=", 1)
        if directive in ("StartLimitIntervalSec", "StartLimitBurst") and version < START_LIMIT_IN_UNIT:
            moved.append("{}={}".format(directive.replace("IntervalSec", "Interval"), value))
            continue
        since, older = SINCE.get(directive + "=" + value, SINCE.get(directive, (0, None)))
        if directive == "SystemCallFilter" and "@" in value:
            since, older = SYSCALL_GROUPS
        if version >= since:
            out.append(line)
        elif older is not None:
            out.append(older if "=" in older else "{}={}".format(older, _convert(directive, value)))
    if moved and service_at is not None:
        out[service_at:service_at] = moved
    return "\n".join(out) + ("\n" if unit.endswith("\n") else "")


# The verdicts of roles/dcu_vllm/files/vllm-wait-ready, the unit's ExecStartPost: why a start failed.
WAITER_VERDICT = re.compile(r"does not serve .* after \d+s|main process \(pid \d+\) exited after")


def failed_start_lines(lines, count=8):
    """The `count` log lines of a unit that end with its waiter's last verdict, or its last `count` lines.

    After a failed start systemd starts the unit again (Restart=on-failure) and a rollback stops that start,
    so the log's tail tells of the start that was stopped, not of the one that failed."""
    lines = list(lines or [])
    verdicts = [i for i, line in enumerate(lines) if WAITER_VERDICT.search(line)]
    end = verdicts[-1] + 1 if verdicts else len(lines)
    return lines[max(0, end - int(count)):end]


def changed_lines(now, was):
    """{now: the lines of `now` not in `was`, was: the lines of `was` not in `now`}, each stripped, blank and comment
    lines (# or ;, as in unit and environment files) left out: what a rollback says a file's change was, both ways."""
    def meaning(text):
        return [line.strip() for line in (text or "").splitlines() if line.strip() and line.lstrip()[0] not in "#;"]
    now_lines, was_lines = meaning(now), meaning(was)
    return {"now": [line for line in now_lines if line not in was_lines],
            "was": [line for line in was_lines if line not in now_lines]}
