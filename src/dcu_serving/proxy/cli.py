"""dcu-proxy command line: `dcu-proxy --config /etc/dcu-serving/proxy.yml [overrides]`."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

from . import config as configuration

try:  # libuv's event loop: about 20% less CPU per proxied request (bench/proxy_overhead.py)
    from uvloop import run
except ImportError:  # a platform without uvloop wheels still works, on asyncio's own loop
    from asyncio import run


KINDS = ", ".join(configuration.KINDS)


def notify_systemd() -> None:
    """READY=1 to systemd once the proxy listens and has checked its backends once: the unit is Type=notify, so
    `systemctl start dcu-proxy` returns, and the unit counts as active, only when the proxy serves (sd_notify's
    protocol, a datagram to $NOTIFY_SOCKET). Outside a unit the variable is unset and nothing is sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(address)
        sock.sendall(b"READY=1")


def backend(value: str) -> tuple[str | None, str]:
    """--backend [KIND=]URL -> (kind or None, URL). A URL is checked with the rest of the configuration."""
    kind, sep, url = value.partition("=")
    if not sep or ":" in kind or "/" in kind:  # no KIND= in front: the whole value is the URL
        return None, value
    if kind not in configuration.KINDS:
        raise argparse.ArgumentTypeError(f"unknown kind {kind!r} in {value!r}: write KIND=URL with KIND one of "
                                         f"{KINDS}, or the URL alone")
    return kind, url


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="dcu-proxy", description="Reverse proxy in front of a host's vLLM instances "
        "(routing by model, least-active within a model's pool, health checks, the service contract, results log).",
        epilog="Several kinds on one host (e.g. chat on some cards, embeddings on another) need proxy.yml's form "
               "where each backend names its models and kind: backends: [{url: URL, models: [NAME], kind: KIND}] "
               "(docs/proxy.md).")
    parser.add_argument("--config", metavar="PATH",
                        help=f"YAML configuration (on hosts: {configuration.DEFAULT_PATH})")
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (overrides listen)")
    parser.add_argument("--backend", metavar="[KIND=]URL", action="append", type=backend,
                        help="a vLLM instance, e.g. http://127.0.0.1:8002, serving every --model; repeat for each "
                             "(overrides backends). KIND= says what it serves, which decides the APIs that reach "
                             f"it: one of {KINDS} (e.g. embedding=http://127.0.0.1:8008 for /v1/embeddings); "
                             "without it, the file's `kind`, else chat. Every --backend has the same kind")
    parser.add_argument("--model", metavar="NAME", action="append",
                        help="a served model name; repeat for each (overrides models)")
    parser.add_argument("--results-log", metavar="PATH", help="JSONL results log (overrides results_log)")
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")
    args = parser.parse_args(argv)
    backends = args.backend or []
    # One kind for them all, when one names it (a --backend without KIND= beside it is chat).
    kinds = {kind or "chat" for kind, _ in backends} if any(kind for kind, _ in backends) else set()
    if len(kinds) > 1:
        parser.error(f"argument --backend: the backends are of {len(kinds)} kinds ({', '.join(sorted(kinds))}), but "
                     f"every --backend serves every --model and a model has one kind. Give each backend its own "
                     f"models and kind in proxy.yml: backends: [{{url: URL, models: [NAME], kind: KIND}}]")
    args.kind = kinds.pop() if kinds else None
    args.backend = [url for _, url in backends] or None
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    overrides = {"listen": args.listen, "backends": args.backend, "models": args.model, "kind": args.kind,
                 "results_log": args.results_log}

    def load():
        return configuration.load(args.config, overrides)

    try:
        config = load()
        if args.check:  # the certificate and key as the listener will load them
            configuration.tls_context(config)
    except configuration.ConfigError as e:
        print(f"dcu-proxy: configuration error: {e}", file=sys.stderr)
        return 2
    if args.check:
        served = {}  # model -> (kind, backends)
        for spec in config.specs:
            for model in spec.models:
                kind, count = served.get(model, (spec.kind, 0))
                served[model] = (kind, count + 1)
        models = ", ".join(f"{model} ({kind}, {count})" for model, (kind, count) in served.items()) \
            if len({spec.models for spec in config.specs}) > 1 or config.specs[0].kind != "chat" \
            else ", ".join(config.models)
        tls = f", TLS on {config.tls_listen}" if config.tls_listen else ""
        print(f"dcu-proxy: configuration OK ({len(config.backends)} backends, models {models}{tls})")
        return 0
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .server import serve  # aiohttp is imported only when serving

    try:
        run(serve(config, load, ready=notify_systemd))
    except configuration.ConfigError as e:
        print(f"dcu-proxy: configuration error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. the port is taken
        print(f"dcu-proxy: cannot serve: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
