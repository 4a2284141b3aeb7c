"""`dcu-benchmark`: the load curve of a serving entrance, measured with aiperf, read at a glance.

    dcu-benchmark --url http://HOST:8000 --model MiniCPM-V-4.5 --concurrency 1,2,4,8,16,32,48 --out DIR

runs one aiperf level per concurrency with the seeds' workload (workload.py) and writes into DIR:
results.json (the settings, each level's numbers as aiperf exported them, the knee), report.html (settings,
table and plots in one file), the plots as PNG files, raw/c<N>/ (aiperf's own exports and console per level)
and workload/ (the dataset and the tokenizer aiperf was given). Exit status: 0 measured; 1 a level where
every request failed (the run stops there; what was measured is still written); 2 the target, the model or
aiperf cannot be used at all.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from dcu_serving.capacity import knee as kneefit
from dcu_serving.capacity import loadgen, report
from dcu_serving.capacity.workload import Workload, byte_tokenizer, write_dataset


class Unusable(Exception):
    """The run cannot start: exit 2 with this message."""


def levels_arg(text: str) -> list[int]:
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError("concurrency levels are integers >= 1")
    return levels


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dcu-benchmark", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", required=True, help="the entrance, e.g. http://HOST:8000 (dcu-proxy or the gateway)")
    p.add_argument("--model", required=True, help="the served model name, exactly")
    p.add_argument("--concurrency", required=True, type=levels_arg, help="levels, e.g. 1,2,4,8,16,32")
    p.add_argument("--out", required=True, type=Path, help="directory for results.json, report.html, raw/")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--requests-per-level", type=int, default=64,
                        help="requests sent at each level (at least 2 per caller: raised to 2 x concurrency)")
    amount.add_argument("--duration", type=float, help="seconds of load at each level, instead of a request count")
    w = Workload()
    p.add_argument("--image-width", type=int, default=w.image_width)
    p.add_argument("--image-height", type=int, default=w.image_height)
    p.add_argument("--images", type=int, default=w.images, help="images per request (0: text only)")
    p.add_argument("--prompt-words", type=int, default=w.prompt_words, help="words added to the seeds' prompt")
    p.add_argument("--output-tokens", type=int, default=w.output_tokens, help="max tokens of each answer")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=w.stream,
                   help="streamed answers (TTFT and inter-token latency are only measured when streamed)")
    p.add_argument("--thinking", action="store_true", help="chat_template_kwargs.enable_thinking true")
    p.add_argument("--aiperf", help="the aiperf executable (default: beside this Python, else on PATH)")
    p.add_argument("--api-key", metavar="ENV-NAME",
                   help="name of the environment variable holding the API key (the key itself is never an argument)")
    p.add_argument("--label", default="", help="free text shown in the report, e.g. the host and its layout")
    return p


def find_aiperf(given: str | None) -> str:
    candidates = [given] if given else [str(Path(sys.executable).with_name("aiperf")), shutil.which("aiperf")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise Unusable(f"aiperf not found ({given or 'beside ' + sys.executable + ' or on PATH'}): install "
                   f"dcu-serving[benchmark] (aiperf=={loadgen.AIPERF_VERSION}) or pass --aiperf PATH")


def aiperf_version(aiperf: str) -> str:
    try:
        out = subprocess.run([aiperf, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unusable(f"{aiperf} --version failed: {e}") from None
    version = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0 or not version:
        raise Unusable(f"{aiperf} --version failed: {(out.stderr or out.stdout).strip()[-500:]}")
    return version


def check_target(url: str, model: str, key: str | None):
    """The entrance answers and serves `model`: an unreachable host or a misspelt name fails here, in a
    second, not after aiperf has started and every request has failed."""
    request = urllib.request.Request(url.rstrip("/") + "/v1/models",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            served = [m.get("id") for m in json.load(response).get("data", [])]
    except urllib.error.HTTPError as e:
        raise Unusable(f"{url}/v1/models answered HTTP {e.code}: {e.read()[:300].decode(errors='replace')}") from None
    except (OSError, ValueError) as e:
        raise Unusable(f"cannot reach {url}: {getattr(e, 'reason', e)}") from None
    if model not in served:
        raise Unusable(f"{url} does not serve the model {model!r}; it serves: {', '.join(map(str, served)) or 'none'}")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def run(args) -> int:
    key = None
    if args.api_key:
        key = os.environ.get(args.api_key)
        if not key:
            raise Unusable(f"--api-key {args.api_key}: that environment variable is not set")
    aiperf = find_aiperf(args.aiperf)
    version = aiperf_version(aiperf)
    check_target(args.url, args.model, key)

    out: Path = args.out
    workload = Workload(prompt_words=args.prompt_words, image_width=args.image_width,
                        image_height=args.image_height, images=args.images, output_tokens=args.output_tokens,
                        thinking=args.thinking, stream=args.stream)
    started = now()
    stamp = time.strftime("%Y%m%d%H%M%S")
    dataset = write_dataset(workload, out / "workload", orid_prefix=f"bench-{stamp}")
    hf_cache = out / "workload" / "hf-cache"
    tokenizer = byte_tokenizer(hf_cache)
    env = loadgen.offline_env(hf_cache)

    levels, status = [], 0
    for concurrency in args.concurrency:
        requests = None if args.duration else max(args.requests_per_level, 2 * concurrency)
        level_dir = out / "raw" / f"c{concurrency}"
        shutil.rmtree(level_dir, ignore_errors=True)  # a rerun into the same DIR: no stale export is read
        cmd = loadgen.command(aiperf, url=args.url, model=args.model, dataset=dataset, tokenizer=tokenizer,
                              concurrency=concurrency, out=level_dir, stream=args.stream, requests=requests,
                              duration=args.duration, api_key=key)
        begun = time.monotonic()
        ran = loadgen.run_level(cmd, level_dir, concurrency, env, secret=key)
        level = loadgen.parse_export(level_dir, concurrency)
        level["aiperf_exit"] = ran.returncode
        level["wall_s"] = round(time.monotonic() - begun, 2)
        levels.append(level)
        print(f"concurrency {concurrency:>4}: {level['requests']} ok, {level['errors']} failed, "
              f"{_fmt(level['request_throughput_rps'], '{:.2f} req/s')}, "
              f"TTFT p50 {_fmt(level['ttft_p50_ms'], '{:.0f} ms')}, ITL p50 {_fmt(level['itl_p50_ms'], '{:.1f} ms')} "
              f"({level['wall_s']:.0f} s)", flush=True)
        if level["requests"] == 0:
            detail = "; ".join(level.get("error_examples") or []) or loadgen.last_lines(ran.console)
            print(f"dcu-benchmark: every request failed at concurrency {concurrency} (aiperf exit "
                  f"{ran.returncode}); stopping. {detail}", file=sys.stderr)
            status = 1
            break

    points = [(lv["concurrency"], lv["request_throughput_rps"]) for lv in levels
              if lv["requests"] and lv["request_throughput_rps"] is not None]
    results = {
        "settings": {"url": args.url, "model": args.model, "label": args.label, "levels": args.concurrency,
                     "requests_per_level": None if args.duration else args.requests_per_level,
                     "duration_s": args.duration, "workload": workload.as_dict(), "aiperf": aiperf,
                     "aiperf_version": version, "aiperf_request_timeout_s": loadgen.REQUEST_TIMEOUT_S},
        "started": started, "finished": now(),
        "levels": levels,
        "knee": kneefit.find_knee(points).as_dict(),
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    pngs = report.plot(results, out)
    report.write_html(results, pngs, out / "report.html")
    knee = results["knee"]
    print(f"knee: {knee['concurrency'] if knee['concurrency'] is not None else 'none'}"
          f"{'' if knee['concurrency'] is not None else ' (' + knee['reason'] + ')'}")
    print(f"report: {out / 'report.html'}")
    return status


def _fmt(value, fmt: str) -> str:
    return "—" if value is None else fmt.format(value)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.requests_per_level < 1 or (args.duration is not None and args.duration <= 0):
        parser().error("--requests-per-level and --duration must be positive")
    try:
        return run(args)
    except Unusable as e:
        print(f"dcu-benchmark: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
