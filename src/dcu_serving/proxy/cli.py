"""dcu-proxy command line: `dcu-proxy --config /etc/dcu-serving/proxy.yml [overrides]`."""

from __future__ import annotations

import argparse
import logging
import sys

from . import config as configuration

try:  # libuv's event loop: about 20% less CPU per proxied request (bench/proxy_overhead.py)
    from uvloop import run
except ImportError:  # a platform without uvloop wheels still works, on asyncio's own loop
    from asyncio import run


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="dcu-proxy", description="Reverse proxy in front of a host's vLLM instances "
        "(routing by model, least-active within a model's pool, health checks, the service contract, results log).")
    parser.add_argument("--config", metavar="PATH",
                        help=f"YAML configuration (on hosts: {configuration.DEFAULT_PATH})")
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (overrides listen)")
    parser.add_argument("--backend", metavar="URL", action="append",
                        help="a vLLM instance, e.g. http://127.0.0.1:8002; repeat for each (overrides backends)")
    parser.add_argument("--model", metavar="NAME", action="append",
                        help="a served model name; repeat for each (overrides models)")
    parser.add_argument("--results-log", metavar="PATH", help="JSONL results log (overrides results_log)")
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    overrides = {"listen": args.listen, "backends": args.backend, "models": args.model,
                 "results_log": args.results_log}

    def load():
        return configuration.load(args.config, overrides)

    try:
        config = load()
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
            if len({spec.models for spec in config.specs}) > 1 else ", ".join(config.models)
        print(f"dcu-proxy: configuration OK ({len(config.backends)} backends, models {models})")
        return 0
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .server import serve  # aiohttp is imported only when serving

    try:
        run(serve(config, load))
    except configuration.ConfigError as e:
        print(f"dcu-proxy: configuration error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. the port is taken
        print(f"dcu-proxy: cannot serve: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
