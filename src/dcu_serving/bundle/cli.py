"""`dcu-bundle build|verify|list`: the offline bundle from the command line (docs/bundle.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from dcu_serving.bundle.artifact import read_artifacts
from dcu_serving.bundle.build import Builder, BuildError, Progress, human
from dcu_serving.bundle.checksum import ChecksumCache, default_cache_path
from dcu_serving.bundle.index import BundleIndexError, describe, verify
from dcu_serving.bundle.manifest import ManifestError, parse


def _cache(args) -> ChecksumCache:
    return ChecksumCache(None if args.no_cache else (args.cache or default_cache_path()))


def cmd_build(args) -> int:
    try:
        manifest = parse(yaml.safe_load(Path(args.manifest).read_text()))
    except OSError as e:
        print(f"dcu-bundle: cannot read the manifest: {e}", file=sys.stderr)
        return 2
    except ManifestError as e:
        print(f"dcu-bundle: {e}", file=sys.stderr)
        return 2
    progress = Progress(interval=args.progress_interval, log=args.log)
    builder = Builder(manifest, Path(args.out), _cache(args), progress)
    try:
        artifacts = builder.run()
    except BuildError as e:
        print(f"dcu-bundle: {e}", file=sys.stderr)
        return 1
    for w in builder.warnings:
        print(f"dcu-bundle: WARNING {w}", file=sys.stderr)
    changed = [o for o in builder.outcomes if o.action not in ("kept", "skipped")]
    if args.json:
        print(json.dumps({
            "changed": bool(changed),
            "bundle": str(Path(args.out).resolve()),
            "artifacts": len(artifacts),
            "size": sum(a.size for a in artifacts),
            "outcomes": [o.__dict__ for o in builder.outcomes],
            "warnings": builder.warnings,
        }, indent=1))
    else:
        for o in builder.outcomes:
            note = f"  ({o.note})" if o.note else ""
            print(f"{o.action:<10} {human(o.size):>10}  {o.seconds:6.1f}s  {o.file}{note}")
        print(f"{len(artifacts)} artifacts, {human(sum(a.size for a in artifacts))}, "
              f"{len(changed)} changed, in {Path(args.out)}")
    return 0


def cmd_verify(args) -> int:
    bundle = Path(args.bundle)
    index, problems = verify(bundle, _cache(args))
    if args.json:
        print(json.dumps({"ok": not problems, "bundle": str(bundle.resolve()), "problems": problems}, indent=1))
    elif problems:
        for p in problems:
            print(describe(p))
        print(f"{bundle}: {len(problems)} problem(s)", file=sys.stderr)
    else:
        print(f"{bundle}: OK ({len(index['artifacts'])} artifacts, every sum verified, no unlisted file)")
    return 1 if problems else 0


def cmd_list(args) -> int:
    try:
        artifacts = read_artifacts(Path(args.bundle))
    except BundleIndexError as e:
        print(f"dcu-bundle: {e}", file=sys.stderr)
        return 1
    for a in artifacts:
        extra = f"  refs={','.join(a.extra.get('refs', []))} config={a.extra['config_digest']}" \
            if a.kind == "image" else ""
        print(f"{a.kind:<10} {a.name:<28} {a.version:<18} {human(a.size):>10}  {a.file}  ({a.source}){extra}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dcu-bundle", description="Build, verify and list dcu-serving offline bundles.")
    p.add_argument("--cache", type=Path, help="sha256 cache file (default: the one bundle_artifact uses)")
    p.add_argument("--no-cache", action="store_true", help="re-read every file instead of trusting (size, mtime)")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build or update a bundle from a manifest (YAML or JSON)")
    b.add_argument("--manifest", required=True, help="file with dcu_bundle_manifest (or the manifest itself)")
    b.add_argument("--out", default="bundle", help="bundle directory (default: ./bundle)")
    b.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    b.add_argument("--progress-interval", type=float, default=2.0, help="seconds between progress lines")
    b.add_argument("--log", type=Path, help="also append progress lines to this file (to follow with tail -f)")
    b.set_defaults(func=cmd_build)
    v = sub.add_parser("verify", help="check a bundle offline: presence, sizes, sums, unlisted files")
    v.add_argument("bundle", nargs="?", default="bundle")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_verify)
    ls = sub.add_parser("list", help="what the bundle holds and where each artifact came from")
    ls.add_argument("bundle", nargs="?", default="bundle")
    ls.set_defaults(func=cmd_list)
    args = p.parse_args(argv)
    return args.func(args)
