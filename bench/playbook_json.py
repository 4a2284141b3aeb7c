"""ansible-playbook with the ansible.posix.json callback, as the benchmarks run it: the wall time, the parsed
report (None when it printed none), and how long each task took by the callback's own clock."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime


def run_json(argv: list[str], env: dict, cwd) -> tuple[float, subprocess.CompletedProcess, dict | None]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd,
                          env=dict(env, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    wall = time.monotonic() - started
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        report = None
    return wall, done, report


def task_seconds(task: dict) -> float:
    span = task["task"]["duration"]
    return _ts(span["end"]) - _ts(span["start"])


def _ts(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
