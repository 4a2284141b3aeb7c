"""dcu-doctor: one read-only look at a DCU host, each failing check printed with its fix.

    host.py     the host as the checks see it: roots (sysfs, /dev, /etc, ...), commands with a deadline,
                and what the roles wrote there (device-access.json, vllm/*.env, proxy.yml)
    checks.py   the checks, in the order a problem propagates: driver, hymgr, device nodes and groups,
                versions, images, units, ports, proxy health, disk, shm
    cli.py      `dcu-doctor [--json]`: exit 0 when nothing failed, 1 otherwise
    pack.py     the doctor as one zipapp (standard library only) for hosts without dcu-serving installed

It runs on the host's own python3 (3.9 and newer: EL hosts may have an older one than the proxy's venv),
with the standard library only; PyYAML, when present, reads proxy.yml.
"""
