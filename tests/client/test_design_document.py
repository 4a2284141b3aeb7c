"""The design document's standard-client example, run as written against dcu-proxy in front of 8 simulators.

Teams copied the first design document's example (its client was `client_45`, returning a dict) into their own
code. With only the import changed, the same lines run on ours and print the same things: the answer, then
`finish_reason backend completion_tokens`, then the streamed answer.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from PIL import Image

from support import FAST_HEALTH, FAST_SIM

# The code block of the section "标准客户端：契约的最优载体" of the first design document
# (shared/seeds/000_583f59b2c05b1029.txt), verbatim. That file lost its line breaks: they are put back before
# each statement and comment; joined with single spaces these lines are the block's text exactly.
DOCUMENT_EXAMPLE = """\
from client_45 import recognize, recognize_stream, check_service, strip_thinking
# 探活（比 /v1/models 更真实：返回几个后端健康）
ok, hp, ids = check_service() # True, "8/8"
# 非流式识图
r = recognize("test.jpg", prompt="图里有几个人？", orid="ORD-123", max_tokens=1024)
print(r["answer"]) # 已剥 think 的最终答案
print(r["finish_reason"], r["backend"], r["completion_tokens"])
# 关 think 批量跑（快 3–4 倍）
r = recognize("test.jpg", orid="ORD-124", enable_thinking=False)
# 流式
for piece in recognize_stream("test.jpg", orid="ORD-125"): print(piece, end="", flush=True)
"""
IMPORT = "from client_45 import"
OURS = "from dcu_serving.client import"
# After the example, what its names hold, on a line of its own, for the test to compare with what it printed.
EPILOGUE = """
print()
import json
print("EXAMPLE-STATE " + json.dumps({"ok": ok, "hp": hp, "ids": ids, "r": dict(r), "keys": list(r.keys()),
                                     "strip_thinking": strip_thinking("<think>x</think>y")}))
"""
CARDS = 8


@pytest.fixture
def cluster(start_sim, start_proxy):
    """8 simulated cards behind the proxy, as in the document (8 instances behind :8000)."""
    sims = [start_sim(*FAST_SIM, wait=False) for _ in range(CARDS)]
    for sim in sims:
        sim.wait_ready()
    return start_proxy([s.url for s in sims], healthy=CARDS, health=FAST_HEALTH)


def test_the_documents_client_example_runs_with_only_the_import_changed(cluster, tmp_path):
    assert DOCUMENT_EXAMPLE.count(IMPORT) == 1
    script = DOCUMENT_EXAMPLE.replace(IMPORT, OURS) + EPILOGUE
    Image.new("RGB", (64, 48), "blue").save(tmp_path / "test.jpg", "JPEG")  # the example's "test.jpg", in its cwd
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "DCU_SERVING_URL": cluster.url})
    assert run.returncode == 0, run.stderr
    printed, _, state_line = run.stdout.rpartition("EXAMPLE-STATE ")
    state = json.loads(state_line)
    backends = {u.split("://", 1)[1] for u in cluster.backends}

    # check_service(): True, "8/8", and the healthy backends' ids
    assert state["ok"] is True and state["hp"] == f"{CARDS}/{CARDS}" and set(state["ids"]) == backends

    # print(r["answer"]) then print(r["finish_reason"], r["backend"], r["completion_tokens"])
    answer, status, streamed = printed.split("\n", 2)
    assert answer.strip() and "think>" not in answer
    finish_reason, backend, completion_tokens = status.split(" ")
    assert finish_reason == "stop" and backend in backends and int(completion_tokens) > 0
    logged = cluster.settled_results("ORD-123")
    assert [(x["status"], x["backend"], x["completion_tokens"]) for x in logged] == [
        (200, backend, int(completion_tokens))]

    # the stream: the answer's pieces as they came, without thinking (the epilogue's print() ends its line)
    assert streamed.strip() and "think>" not in streamed and not re.search(r"\bORD-", streamed)
    assert [x["status"] for x in cluster.settled_results("ORD-125")] == [200]

    # the second r (thinking off): the same keys the document reads, the values its attributes hold
    r = state["r"]
    assert {"answer", "finish_reason", "backend", "completion_tokens"} <= set(state["keys"])
    assert r["orid"] == "ORD-124" and r["thinking"] == "" and r["answer"] and r["backend"] in backends
    assert r["completion_tokens"] < int(completion_tokens)  # thinking off costs fewer tokens
    assert state["strip_thinking"] == "y"
