"""What the proxy tests of both runtimes share: a caller on the node (it has no network), the results log."""

from __future__ import annotations

import json
import shlex

from testkit import results_line  # noqa: F401  (the tests take it from here with the calls)

BACKENDS = {"127.0.0.1:8002", "127.0.0.1:8003"}
CALL = """
import json, sys, urllib.request
body = json.dumps({"model": "MiniCPM-V-4.5", "user": sys.argv[1], "max_tokens": 8,
                   "messages": [{"role": "user", "content": "Read the invoice number."}],
                   "chat_template_kwargs": {"enable_thinking": False}}).encode()
request = urllib.request.Request("http://127.0.0.1:8000/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=30) as answer:
    print(json.dumps({"status": answer.status, "headers": dict(answer.headers)}))
"""


def call(host, orid: str) -> dict:
    """POST a chat completion to :8000 on the node, as a caller there would: {status, headers}."""
    out = host.run(f"python3 -c {shlex.quote(CALL)} {shlex.quote(orid)}")
    assert out.rc == 0, out.stderr
    return json.loads(out.stdout)


def main_pid(host) -> str:
    return host.check_output("systemctl show --property=MainPID --value dcu-proxy")


def user_of(host, pid) -> str:
    """The user a process runs as (ps would cut a name of more than 8 characters)."""
    uid = host.check_output(f"stat --format=%u /proc/{pid}")
    return host.check_output(f"getent passwd {uid} | cut -d: -f1")


def command_line(host, pid) -> str:
    return host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
