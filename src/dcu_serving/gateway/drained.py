"""Serving hosts the gateway leaves out while an operator's play changes them (docs/fleet.md, "Draining a host").

The file (DCU_GATEWAY_DRAINED, default /var/lib/dcu-gateway/drained.json) names the drained hosts:

    {"hosts": {"node-a": {"since": 1767000000.123, "reason": "serving.yml"}}}

`playbooks/serving.yml` and `rolling_restart.yml` add a host before changing it and remove it once it serves N/N
again, with this module's command line on the gateway (`python -m dcu_serving.gateway.drained drain HOST`, under
a lock: hosts changed `serial` at a time write it at once). The gateway's hook (hooks.py) reads it again whenever
it changes and leaves the drained hosts' deployments out of routing, before LiteLLM picks one: no request is
sent to a drained host, so none is refused, retried or lost. A deployment is a host's when its model_info.id is
`<host>/<model>` (the gateway_config filter names them so). When every deployment of a model is drained, none
is left out: a host being changed answers better than no host at all.

Why not dcu-proxy answering 503 to the gateway while drained: LiteLLM 1.106 retries a 503 without leaving out
the deployment that answered it (Router._deployment_ids_to_skip_on_retry skips only non-retryable statuses), and
least-busy routing favours the drained host, which answers at once; so the retry often lands on the same host and
the caller gets the 503, until allowed_fails + 1 failures cool the host down.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import sys
import tempfile
import time

ENV = "DCU_GATEWAY_DRAINED"
DEFAULT_PATH = "/var/lib/dcu-gateway/drained.json"

log = logging.getLogger("dcu_serving.gateway")


def path() -> str:
    return os.environ.get(ENV) or DEFAULT_PATH


def load(file: str) -> dict[str, dict]:
    """{host: {since, reason}}; no file is no drained host."""
    try:
        with open(file, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return {}
    hosts = doc.get("hosts") if isinstance(doc, dict) else None
    if not isinstance(hosts, dict):
        raise ValueError(f"{file}: expected {{\"hosts\": {{HOST: {{...}}}}}}")
    return {str(h): (v if isinstance(v, dict) else {}) for h, v in hosts.items()}


def update(file: str, host: str, drained: bool, reason: str = "") -> dict:
    """Drain or undrain `host` in `file` (atomic replace, under a lock). Returns what changed and the drained hosts."""
    directory = os.path.dirname(file) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    with open(os.path.join(directory, "." + os.path.basename(file) + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hosts = load(file)
        changed = (host in hosts) != drained
        now = time.time()
        if drained and changed:
            hosts[host] = {"since": now, "reason": reason}
        elif not drained:
            hosts.pop(host, None)
        if changed:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(file))
            with os.fdopen(fd, "w") as f:
                json.dump({"hosts": hosts}, f, indent=1, sort_keys=True)
                f.write("\n")
            os.chmod(tmp, 0o644)  # the gateway's service user reads it
            os.rename(tmp, file)
    return {"changed": changed, "host": host, "drained": drained, "time": now, "hosts": sorted(hosts)}


def host_of(deployment: dict) -> str | None:
    """The serving host of a deployment: the part of its model_info.id before the first '/'."""
    ident = (deployment.get("model_info") or {}).get("id") if isinstance(deployment, dict) else None
    if not isinstance(ident, str) or "/" not in ident:
        return None
    return ident.split("/", 1)[0]


def without(deployments: list, drained) -> list:
    """The deployments not on a drained host; all of them when that would leave none."""
    if not drained or not isinstance(deployments, list):
        return deployments
    kept = [d for d in deployments if host_of(d) not in drained]
    return kept or deployments


class Drained:
    """The drained hosts of the file, read again when it changes (one stat a request)."""

    def __init__(self, file: str | None = None):
        self.file = file
        self._stamp: tuple | None = None
        self._hosts: frozenset = frozenset()

    def hosts(self) -> frozenset:
        file = self.file or path()
        try:
            st = os.stat(file)
        except FileNotFoundError:
            self._stamp, self._hosts = None, frozenset()
            return self._hosts
        except OSError as e:  # unreadable: keep what was read last, and say so
            log.error("cannot read the drained hosts in %s: %s; keeping %s", file, e, sorted(self._hosts))
            return self._hosts
        stamp = (file, st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            try:
                self._hosts = frozenset(load(file))
            except (OSError, ValueError) as e:
                log.error("cannot read the drained hosts in %s: %s; keeping %s", file, e, sorted(self._hosts))
                return self._hosts
            self._stamp = stamp
        return self._hosts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dcu_serving.gateway.drained",
                                     description="Drain or undrain a serving host on this gateway (docs/fleet.md).")
    parser.add_argument("action", choices=("drain", "undrain", "show"))
    parser.add_argument("host", nargs="?")
    parser.add_argument("--file", default=None, help=f"default ${ENV} or {DEFAULT_PATH}")
    parser.add_argument("--reason", default="")
    args = parser.parse_args(argv)
    file = args.file or path()
    if args.action == "show":
        print(json.dumps({"hosts": load(file)}, sort_keys=True))
        return 0
    if not args.host:
        parser.error(f"{args.action} needs the host's inventory name")
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(update(file, args.host, args.action == "drain", args.reason), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
