"""aiperf (NVIDIA's load generator, pinned 0.13.0) as dcu-benchmark drives it: one `aiperf profile` per
concurrency level, offline, and the numbers read back from aiperf's own export files.

One invocation per level rather than aiperf's comma-list sweep (`--concurrency 1,2,4`): measured on a
2-core machine, a sweep restarts aiperf's services for every cell anyway (~6 s a cell, the same as a fresh
invocation), while a process per level gives each level its own exit status, its own log and its own export
directory, and lets the run stop at the first level where nothing succeeded.

Offline: aiperf loads a Hugging Face tokenizer even when every count comes from the server
(--use-server-token-count). Its `builtin` tokenizer downloads tiktoken's o200k_base on first use; a local
tokenizer *directory* is not accepted in offline mode (aiperf 0.13 passes the path to `snapshot_download`,
which wants a repository id). So the byte tokenizer (workload.byte_tokenizer) is laid out as a repository in a
private Hugging Face cache, named by a repository id, and aiperf runs with HF_HUB_OFFLINE=1 against that
cache: a miss fails instead of downloading.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

AIPERF_VERSION = "0.13.0"
# Longer than the proxy's own request_timeout (300 s): a request the service gives up on counts as its error.
REQUEST_TIMEOUT_S = 330


def offline_env(hf_cache: Path, base: dict | None = None) -> dict:
    """The environment aiperf runs in: no hub, no telemetry, the private cache only."""
    env = dict(os.environ if base is None else base)
    env.update({
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_CACHE": str(hf_cache), "HF_HOME": str(hf_cache.parent / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1",
        # aiperf never needs these here; pointing them at an empty directory keeps a stray lookup local
        "TIKTOKEN_CACHE_DIR": str(hf_cache.parent / "tiktoken"),
        "PYTHONUNBUFFERED": "1",
    })
    return env


@dataclass
class LevelRun:
    concurrency: int
    out: Path            # aiperf's artifact directory for this level (DIR/raw/c<N>)
    returncode: int
    console: str         # aiperf's stdout and stderr


def command(aiperf: str, *, url: str, model: str, dataset: Path, tokenizer: str, concurrency: int,
            out: Path, stream: bool, requests: int | None = None, duration: float | None = None,
            api_key: str | None = None) -> list[str]:
    cmd = [aiperf, "profile", "--model", model, "--url", url, "--endpoint-type", "chat",
           "--custom-dataset-type", "single_turn", "--input-file", str(dataset),
           "--tokenizer", tokenizer, "--use-server-token-count",
           "--concurrency", str(concurrency), "--output-artifact-dir", str(out),
           "--request-timeout-seconds", str(REQUEST_TIMEOUT_S),
           # The dataset is ours: without this, aiperf tokenizes its 5 MB Shakespeare corpus for synthetic
           # prompts it will not send (7-16 s a run on 2 cores with the byte tokenizer).
           "--prompt-corpus", "random",
           # Nothing but the target: no DCGM probes on localhost:9400, no scraping of its /metrics.
           "--no-gpu-telemetry", "--no-server-metrics", "--ui", "none"]
    if stream:
        cmd.append("--streaming")
    if duration is not None:
        cmd += ["--benchmark-duration", f"{duration:g}"]
    else:
        cmd += ["--request-count", str(requests)]
    if api_key:
        cmd += ["--api-key", api_key]
    return cmd


def run_level(cmd: list[str], out: Path, concurrency: int, env: dict, secret: str | None = None) -> LevelRun:
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", check=False)
    console = proc.stdout.replace(secret, "<redacted>") if secret else proc.stdout
    (out / "aiperf-console.txt").write_text(console)
    if secret:
        redact(out, secret)  # aiperf's own logs and exports
    return LevelRun(concurrency, out, proc.returncode, console)


def redact(directory: Path, secret: str):
    """aiperf echoes its command line (with --api-key) in its console output and logs: keep no copy of it."""
    for path in directory.rglob("*"):
        if path.is_file() and path.suffix in (".txt", ".log", ".json", ".jsonl", ".csv"):
            text = path.read_text(errors="replace")
            if secret in text:
                path.write_text(text.replace(secret, "<redacted>"))


# aiperf's metric tags -> the fields of results.json. Times are aiperf's milliseconds.
FIELDS = {
    "request_throughput_rps": ("request_throughput", "avg"),
    "output_token_throughput_tps": ("output_token_throughput", "avg"),
    "ttft_p50_ms": ("time_to_first_token", "p50"),
    "ttft_p99_ms": ("time_to_first_token", "p99"),
    "itl_p50_ms": ("inter_token_latency", "p50"),
    "itl_p99_ms": ("inter_token_latency", "p99"),
    "latency_p50_ms": ("request_latency", "p50"),
    "latency_p99_ms": ("request_latency", "p99"),
    "output_tokens_avg": ("output_sequence_length", "avg"),
    "duration_s": ("benchmark_duration", "avg"),
}
SUMMARY = "profile_export_aiperf.json"
RECORDS = "profile_export.jsonl"


def parse_export(directory: Path, concurrency: int) -> dict:
    """One level of results.json from aiperf's export in `directory`.

    profile_export_aiperf.json is aiperf's summary; aiperf writes none when every request failed (it exits 1
    with "All N inference request(s) failed"), and then the per-request records (profile_export.jsonl) give
    the count and the first error."""
    level = {"concurrency": concurrency, "requests": 0, "errors": 0, **dict.fromkeys(FIELDS)}
    summary = directory / SUMMARY
    if summary.is_file():
        data = json.loads(summary.read_text())
        for field, (tag, stat) in FIELDS.items():
            level[field] = (data.get(tag) or {}).get(stat)
        level["requests"] = int((data.get("request_count") or {}).get("avg") or 0)
        level["errors"] = int((data.get("error_request_count") or {}).get("avg") or 0)
        level["error_examples"] = [f"{e['count']}x {_error_text(e.get('error_details') or {})}"
                                   for e in data.get("error_summary") or []][:3]
        level["aiperf_version"] = data.get("aiperf_version")
        level["start_time"], level["end_time"] = data.get("start_time"), data.get("end_time")
        return level
    records = directory / RECORDS
    examples: dict[str, int] = {}
    if records.is_file():
        for line in records.read_text().splitlines():
            record = json.loads(line) if line.strip() else {}
            if record.get("error"):
                level["errors"] += 1
                text = _error_text(record["error"])
                examples[text] = examples.get(text, 0) + 1
            elif record:
                level["requests"] += 1
    level["error_examples"] = [f"{n}x {text}" for text, n in list(examples.items())[:3]]
    return level


def _error_text(error: dict) -> str:
    message = str(error.get("message") or "")
    with contextlib.suppress(ValueError, TypeError, KeyError):  # the server's envelope, as vLLM and the proxy send it
        message = json.loads(message)["error"]["message"]
    return f"{error.get('code') or ''} {message}".strip()[:300]


def last_lines(console: str, n: int = 12) -> str:
    lines = [line for line in console.splitlines() if line.strip()]
    return "\n".join(lines[-n:])
