"""The command line: same flags as `vllm serve`, model directory check, simulated load."""

from __future__ import annotations

import os
import socket
import subprocess

import requests
from sim.simtools import body, chat

from support import FAST_SIM, free_port, python_module, wait_until

ROLE_FLAGS = (  # what the dcu_vllm role renders for a real card
    "--gpu-memory-utilization", "0.9", "--trust-remote-code", "--dtype", "bfloat16",
    "--enable-prefix-caching", "--tensor-parallel-size", "1", "--disable-custom-all-reduce",
    "--enforce-eager", "--max-num-batched-tokens", "16384", "--swap-space", "4",
    "--uvicorn-log-level", "warning", "--disable-log-requests", "--chat-template", "/etc/x.jinja",
    "--some-future-flag", "value", "--no-enable-chunked-prefill",
)


def test_vllm_flags_are_accepted_and_ignored_with_one_warning(start_sim):
    server = start_sim(*FAST_SIM, "--max-num-seqs", "4", "--max-model-len", "8192",
                       "--limit-mm-per-prompt", '{"image": 1}', *ROLE_FLAGS)
    assert requests.get(server.url + "/v1/models", timeout=5).json()["data"][0]["max_model_len"] == 8192
    assert chat(server, body(images=2)).json()["error"]["message"].startswith("At most 1 image(s)")
    warnings = [line for line in server.tail(100).splitlines() if "ignoring vLLM flags" in line]
    assert len(warnings) == 1
    assert "--gpu-memory-utilization 0.9" in warnings[0] and "--some-future-flag value" in warnings[0]
    assert "--no-enable-chunked-prefill" in warnings[0]


def run(*args, timeout=10, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(python_module("dcu_serving.sim", *args), capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_model_directory_must_exist_with_config(tmp_path):
    missing = run("serve", str(tmp_path / "nope"), "--port", str(free_port()))
    assert missing.returncode != 0
    assert "is not a directory" in missing.stderr
    no_config = run("serve", str(tmp_path), "--port", str(free_port()))
    assert no_config.returncode != 0
    assert "config.json does not exist" in no_config.stderr


def test_bad_knobs_are_rejected_with_the_reason(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    bad_flag = run("serve", str(tmp_path), "--sim-fault", "slow:factor=0")
    assert bad_flag.returncode == 2 and "factor must be positive" in bad_flag.stderr
    bad_env = run("serve", str(tmp_path), env={**os.environ, "DCU_SIM_ITL_MS": "fast"})
    assert bad_env.returncode != 0 and "DCU_SIM_ITL_MS" in bad_env.stderr


def test_version_flag():
    assert run("--version").stdout.strip() == "0.11.0"


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True


def test_nothing_listens_while_the_model_loads(start_sim):
    server = start_sim(*FAST_SIM, "--sim-load-seconds", "3", wait=False)
    wait_until(lambda: "loading model weights" in server.tail(), 10, what="load started")
    assert refused(server.port)
    assert server.proc.poll() is None
    server.wait_ready(timeout=15)
    assert not refused(server.port)


def test_knobs_from_the_environment(start_sim):
    server = start_sim("--sim-ttft-ms", "5", env={"DCU_SIM_ITL_MS": "1", "DCU_SIM_THINK_TOKENS": "0",
                                                  "DCU_SIM_ANSWER_TOKENS": "5"})
    reply = chat(server, body()).json()
    # Thinking with 0 tokens is an empty block; the answer is about 5 tokens (±30%).
    assert reply["choices"][0]["message"]["content"].startswith("<think>\n\n</think>\n\n")
    assert 2 + 3 <= reply["usage"]["completion_tokens"] <= 2 + 7


def test_sigterm_stops_it_even_while_loading(start_sim):
    server = start_sim(*FAST_SIM, "--sim-load-seconds", "60", wait=False)
    wait_until(lambda: "loading model weights" in server.tail(), 10, what="load started")
    server.proc.terminate()
    assert server.proc.wait(5) == 0
