"""dcu-recognize: describe images through the service, or check it, from a shell.

Exit codes tell a script what happened without parsing text:
  0 ok · 1 degraded (--check: not every backend healthy) · 2 usage · 3 bad request (fix the input)
  4 service unavailable (502/503/unreachable; retry later) · 5 timeout · 6 truncated (--strict)
"""

from __future__ import annotations

import argparse
import json
import sys

from .api import DEFAULT_PROMPT, DEFAULT_TIMEOUT, Client
from .errors import (
    BadRequestError,
    ServiceError,
    ServiceTimeout,
    TruncatedError,
    UnsupportedImageError,
)

EXIT_OK, EXIT_DEGRADED, EXIT_USAGE, EXIT_BAD_REQUEST, EXIT_UNAVAILABLE, EXIT_TIMEOUT, EXIT_TRUNCATED = range(7)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="dcu-recognize", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("images", nargs="*", metavar="IMAGE", help="image files (1 to 9)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--orid", help="your order id; goes to the request's `user` and the results log")
    p.add_argument("--stream", action="store_true", help="print the answer as it arrives")
    p.add_argument("--no-think", action="store_true", help="turn thinking off (3-4x fewer tokens)")
    p.add_argument("--show-thinking", action="store_true", help="print the thinking block too")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=0.3)
    p.add_argument("--json", action="store_true", help="print a JSON result instead of the answer")
    p.add_argument("--strict", action="store_true", help="fail (exit 6) when the answer was truncated")
    p.add_argument("--url", help="service base URL (default: $DCU_SERVING_URL or http://127.0.0.1:8000)")
    p.add_argument("--model", default="MiniCPM-V-4.5")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    p.add_argument("--no-pad", action="store_true", help="do not pad images beyond 3:1 with white")
    p.add_argument("--check", action="store_true", help="print `healthy N/M`; exit 0 only when all are")
    args = p.parse_args(argv)
    if not args.check and not args.images:
        p.error("give at least one IMAGE, or --check")
    return args


def check(client: Client, as_json: bool) -> int:
    try:
        status = client.lb_status()
    except ServiceError as e:
        print(f"unreachable: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    healthy, total = status.get("healthy", 0), status.get("total", 0)
    if as_json:
        print(json.dumps(status, ensure_ascii=False))
    else:
        print(f"healthy {healthy}/{total}")
        for b in status.get("backends", []):
            if not b.get("healthy"):
                print(f"  unhealthy {b.get('url')}: {b.get('last_error') or 'failing health checks'}")
    if healthy == 0:
        return EXIT_UNAVAILABLE
    return EXIT_OK if healthy == total else EXIT_DEGRADED


def recognize(client: Client, args) -> int:
    kw = dict(orid=args.orid, max_tokens=args.max_tokens, temperature=args.temperature,
              enable_thinking=not args.no_think, strict=args.strict)
    if args.stream:
        stream = client.recognize_stream(args.images, args.prompt, show_thinking=args.show_thinking, **kw)
        for piece in stream:
            if not args.json:
                print(piece, end="", flush=True)
        result = stream.result
        if not args.json:
            print()
    else:
        result = client.recognize(args.images, args.prompt, **kw)
        if not args.json:
            if args.show_thinking and result.thinking:
                print(f"<think>\n{result.thinking}\n</think>\n")
            print(result.answer)
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        tokens = f"{result.prompt_tokens}+{result.completion_tokens} tokens"
        print(f"[{result.finish_reason} · {result.backend} · {tokens} · {result.latency_s}s · orid {result.orid}]",
              file=sys.stderr)
        if result.truncated:
            print("warning: the answer was truncated at --max-tokens; raise it or use --no-think", file=sys.stderr)
    return EXIT_OK


def main(argv=None) -> int:
    args = parse_args(argv)
    client = Client(args.url, model=args.model, timeout=args.timeout,
                    max_aspect=None if args.no_pad else 3.0)
    if args.check:
        return check(client, args.json)
    try:
        return recognize(client, args)
    except (UnsupportedImageError, OSError, ValueError) as e:
        print(f"dcu-recognize: {e}", file=sys.stderr)
        return EXIT_BAD_REQUEST
    except ServiceError as e:
        if args.json:
            print(json.dumps(e.to_dict(), ensure_ascii=False))
        print(f"dcu-recognize: {type(e).__name__}: {e}", file=sys.stderr)
        if isinstance(e, TruncatedError):
            return EXIT_TRUNCATED
        if isinstance(e, BadRequestError):
            return EXIT_BAD_REQUEST
        if isinstance(e, ServiceTimeout):
            return EXIT_TIMEOUT
        return EXIT_UNAVAILABLE


if __name__ == "__main__":
    sys.exit(main())
