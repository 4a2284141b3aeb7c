"""dcu-doctor: check this host, read-only, and print each failing check with its fix.

    dcu-doctor                 the report, one line per finding, a fix under each warning and failure
    dcu-doctor --json          the same as JSON (playbooks/doctor.yml reads it)

Exit status: 0 when nothing failed (warnings included), 1 when a check failed, 2 on bad options.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys

from dcu_serving.doctor.checks import FAIL, OK, SKIP, WARN, run_all
from dcu_serving.doctor.host import Host, Roots

LABELS = {OK: " ok ", WARN: "WARN", FAIL: "FAIL", SKIP: " -- "}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dcu-doctor", description=__doc__.split("\n")[0].split(": ", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--user", action="append", default=[], metavar="NAME",
                        help="a service user to check besides those dcu_driver recorded (repeatable)")
    parser.add_argument("--min-free-gib", type=float, default=20.0, metavar="GIB",
                        help="free space wanted where images and bundles land (default 20)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="deadline of each command (hy-smi blocks while hymgr does not answer; default 10)")
    roots = parser.add_argument_group("where the host's parts are (the real host's by default)")
    defaults = Roots()
    for name in vars(defaults):
        roots.add_argument(f"--{name}-root", dest=name, default=getattr(defaults, name), metavar="PATH",
                           help=f"default {getattr(defaults, name)}")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be more than 0 seconds, got {args.timeout:g}")
    if args.min_free_gib < 0:
        parser.error(f"--min-free-gib must be 0 or more, got {args.min_free_gib:g}")
    return args


def report(findings: list) -> str:
    lines = []
    for finding in findings:
        lines.append(f"[{LABELS[finding.status]}] {finding.check:<13} {finding.message}")
        if finding.fix and finding.status in (FAIL, WARN):
            lines.append("       {:<13} fix: {}".format("", finding.fix))
    counts = {status: sum(1 for f in findings if f.status == status) for status in LABELS}
    lines.append(f"{counts[FAIL]} failed, {counts[WARN]} warnings, {counts[OK]} ok, {counts[SKIP]} not installed")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    roots = Roots(**{name: getattr(args, name) for name in vars(Roots())})
    host = Host(roots=roots, timeout=args.timeout, users=args.user)
    findings = run_all(host, args.min_free_gib)
    failed = any(f.status == FAIL for f in findings)
    if args.json:
        # report and failures: the text form, for playbooks/doctor.yml to print as it is.
        print(json.dumps({"host": socket.gethostname(), "ok": not failed,
                          "checks": [f.as_dict() for f in findings], "report": report(findings).splitlines(),
                          "failures": [f"{f.check}: {f.message}. Fix: {f.fix}" for f in findings if f.status == FAIL]},
                         indent=2))
    else:
        print(f"dcu-doctor on {socket.gethostname()}")
        print(report(findings))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
