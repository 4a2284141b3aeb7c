"""`dcu-exporter`: each DCU card's metrics for Prometheus (docs/operations.md, "Card metrics")."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading

from prometheus_client import CollectorRegistry, start_http_server

from dcu_serving.exporter.collector import CardCollector, HySmi

log = logging.getLogger("dcu_exporter")

# 9400 is where NVIDIA's dcgm-exporter serves card metrics: the port Prometheus users expect a card exporter on,
# free on a DCU host (dcu-proxy :8000, vLLM :8002-8009, node_exporter :9100, Prometheus :9090). Loopback by
# default: the role opens it to the Prometheus host explicitly.
DEFAULT_LISTEN = "127.0.0.1:9400"
# hyhal's two install locations (shared/reference/dcu-host.md); hy-smi is often not on PATH.
HY_SMI_PATHS = ("/opt/hyhal/bin/hy-smi", "/usr/local/hyhal/bin/hy-smi")


def find_hy_smi() -> str:
    """hyhal's hy-smi, else the one on PATH; the first hyhal path when none exists (yet), so that hy-smi
    installed after the exporter started is found at the next scrape and, until then, the error names it."""
    for path in HY_SMI_PATHS:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which("hy-smi") or HY_SMI_PATHS[0]


def listen_address(text: str) -> tuple[str, int]:
    """'HOST:PORT', '[::1]:PORT' or ':PORT' (every interface) -> (host, port)."""
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dcu-exporter",
                                description="Serve each DCU card's utilisation, VRAM, temperature, power and health "
                                            "from hy-smi and sysfs as Prometheus metrics.")
    p.add_argument("--listen", type=listen_address, default=DEFAULT_LISTEN,
                   help=f"HOST:PORT to serve /metrics on, ':PORT' for every interface (default {DEFAULT_LISTEN})")
    p.add_argument("--hy-smi", help=f"hy-smi to run (default: the first of {', '.join(HY_SMI_PATHS)}, then PATH)")
    p.add_argument("--hy-smi-timeout", type=float, default=8.0,
                   help="seconds one hy-smi call may take; it blocks while hymgr does not answer. Below "
                        "Prometheus' default scrape timeout (10 s), so a stuck hy-smi still gives a scrape "
                        "(default 8)")
    p.add_argument("--min-interval", type=float, default=5.0,
                   help="seconds a reading is served before hy-smi runs again, whatever the number of "
                        "scrapers (default 5)")
    p.add_argument("--services", metavar="FILE",
                   help='JSON file {"<card index or PCI address>": "<service>"} for the service label; '
                        "read at each reading, absent means no service labels")
    p.add_argument("--sysfs-root", default="/sys", help="where sysfs is mounted (default /sys)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def serve(args: argparse.Namespace):
    """Start serving in a thread; the HTTP server (its .server_address has the port when 0 was asked)."""
    collector = CardCollector(HySmi(args.hy_smi or find_hy_smi(), args.hy_smi_timeout), sysfs_root=args.sysfs_root,
                              services_file=args.services, min_interval=args.min_interval)
    registry = CollectorRegistry()
    registry.register(collector)
    host, port = args.listen
    server, _thread = start_http_server(port, addr=host, registry=registry)
    log.info("serving card metrics on http://%s:%d/metrics (hy-smi %s, sysfs %s, services %s)",
             host, server.server_address[1], collector.hy_smi.path, args.sysfs_root, args.services or "none")
    return server


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server = serve(args)
    except OSError as e:
        log.error("cannot listen on %s:%d: %s", *args.listen, e)
        return 1
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    server.server_close()
    return 0
