"""One 8-card host carved into model services (host_vars/node.yml), converged twice: every service answers in its
own API through the host's proxy, and every layout the preflight must refuse is refused in seconds, before
anything starts. Tests run in file order; the refusals come last and leave the services running."""

from __future__ import annotations

import base64
import io
import json
import re
import threading
import time
import uuid
from pathlib import Path

import requests
import yaml
from openai import OpenAI
from PIL import Image
from testkit import results_line

testinfra_hosts = ["node"]
UNITS = ["vllm@chat-0", "vllm@vision-0", "vllm@vision-1", "vllm@vision-2", "vllm@vision-3", "vllm@embed-0",
         "vllm@rerank-0"]
MODELS = {"Qwen2.5-14B-Instruct": "chat", "MiniCPM-V-4.5": "vision", "bge-m3": "embedding",
          "bge-reranker-v2-m3": "rerank"}
VISION_BACKENDS = {f"127.0.0.1:{port}" for port in range(8004, 8008)}


def png_uri() -> str:
    page = Image.new("RGB", (64, 48), "white")
    buffer = io.BytesIO()
    page.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_each_service_runs_its_own_units_on_its_own_cards(host):
    for unit in UNITS:
        assert host.service(unit).is_running and host.service(unit).is_enabled, unit
    chat = host.file("/etc/dcu-serving/vllm/chat-0.env").content_string
    assert "--tensor-parallel-size 2 --disable-custom-all-reduce" in chat, "TP over PCIe cards: no custom all-reduce"
    assert "--enable-auto-tool-choice --tool-call-parser hermes" in chat
    devices = json.loads(host.check_output("docker inspect --format '{{json .HostConfig.Devices}}' vllm-chat-0"))
    assert {d["PathOnHost"] for d in devices} >= {"/dev/dri/renderD128", "/dev/dri/renderD129"}
    # Walls: every instance drops Docker's default capabilities; the tensor-parallel one gets SYS_PTRACE back (its
    # workers share GPU buffers through pidfd_getfd), the others nothing.
    for unit in UNITS:
        config = json.loads(host.check_output(f"docker inspect --format '{{{{json .HostConfig}}}}' vllm-{unit[5:]}"))
        added = sorted(c.removeprefix("CAP_") for c in config["CapAdd"] or [])
        assert config["CapDrop"] == ["ALL"] and added == (["SYS_PTRACE"] if unit == "vllm@chat-0" else []), unit
    # Only the vision service opts in to the Python its model directory ships (host_vars/node.yml); the demo
    # inventory's dcu_vllm_trust_remote_code is the default layout's, not every service's.
    assert "--trust-remote-code" not in chat
    assert "--trust-remote-code" in host.file("/etc/dcu-serving/vllm/vision-0.env").content_string
    embed = host.file("/etc/dcu-serving/vllm/embed-0.env").content_string
    assert "--runner pooling" in embed and "--limit-mm-per-prompt" not in embed
    ports = [line.split("=")[1] for unit in UNITS
             for line in host.file(f"/etc/dcu-serving/vllm/{unit.split('@')[1]}.env").content_string.splitlines()
             if line.startswith("VLLM_PORT=")]
    assert len(set(ports)) == len(UNITS), "each instance has its own internal port range"


def test_the_proxy_groups_its_backends_by_model(proxy_url):
    status = requests.get(f"{proxy_url}/__lb_status", timeout=10).json()
    assert (status["healthy"], status["total"]) == (7, 7)
    assert {name: (m["kind"], m["healthy"], m["total"]) for name, m in status["models"].items()} == {
        "Qwen2.5-14B-Instruct": ("chat", 1, 1), "MiniCPM-V-4.5": ("vision", 4, 4), "bge-m3": ("embedding", 1, 1),
        "bge-reranker-v2-m3": ("rerank", 1, 1)}
    listed = requests.get(f"{proxy_url}/v1/models", timeout=10).json()
    assert {m["id"] for m in listed["data"]} == set(MODELS)


def test_chat_and_embeddings_through_the_openai_sdk(host, proxy_url):
    # "unused" is no secret: the proxy takes no key, the SDK insists on one
    client = OpenAI(base_url=f"{proxy_url}/v1", api_key="unused", timeout=60)
    orid = f"mol-chat-{uuid.uuid4().hex[:8]}"
    raw = client.chat.completions.with_raw_response.create(
        model="Qwen2.5-14B-Instruct", messages=[{"role": "user", "content": "Say OK."}], max_tokens=32, user=orid)
    assert raw.headers["X-Backend"] == "127.0.0.1:8002", "the tensor-parallel chat instance on cards 0-1"
    assert raw.parse().choices[0].message.content
    record = results_line(host, orid)
    assert (record["model"], record["api"], record["status"]) == ("Qwen2.5-14B-Instruct", "chat", 200)

    orid = f"mol-embed-{uuid.uuid4().hex[:8]}"
    raw = client.embeddings.with_raw_response.create(model="bge-m3", input=["a DCU card", "a loaf"], user=orid)
    assert raw.headers["X-Backend"] == "127.0.0.1:8008"
    vectors = [item.embedding for item in raw.parse().data]
    assert len(vectors) == 2 and len(vectors[0]) > 100 and vectors[0] != vectors[1]
    record = results_line(host, orid)
    assert (record["model"], record["api"], record["status"]) == ("bge-m3", "embeddings", 200)


def test_vision_requests_go_to_the_vision_cards(proxy_url):
    seen = set()
    for _ in range(8):
        answer = requests.post(f"{proxy_url}/v1/chat/completions", timeout=60, json={
            "model": "MiniCPM-V-4.5", "max_tokens": 16, "user": f"mol-vision-{uuid.uuid4().hex[:6]}",
            "chat_template_kwargs": {"enable_thinking": False},
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": png_uri()}},
                                                      {"type": "text", "text": "What is this?"}]}]})
        assert answer.status_code == 200, answer.text
        seen.add(answer.headers["X-Backend"])
    assert seen <= VISION_BACKENDS and len(seen) > 1, seen


def test_rerank_over_http_ranks_the_matching_document_first(proxy_url):
    answer = requests.post(f"{proxy_url}/v1/rerank", timeout=60, json={
        "model": "bge-reranker-v2-m3", "query": "DCU card driver",
        "documents": ["how to bake bread", "the DCU card needs its driver loaded", "weather today"]})
    assert answer.status_code == 200, answer.text
    assert answer.headers["X-Backend"] == "127.0.0.1:8009"
    assert answer.json()["results"][0]["index"] == 1


def test_an_unknown_model_is_a_404_naming_the_served_ones(proxy_url):
    answer = requests.post(f"{proxy_url}/v1/embeddings", timeout=10, json={"model": "text-embedding-3", "input": "x"})
    assert answer.status_code == 404
    message = answer.json()["error"]["message"]
    assert "text-embedding-3" in message and "bge-m3" in message


# --- The preflight refuses, in seconds, before anything starts ------------------------------------------------

SERVICES = yaml.safe_load((Path(__file__).resolve().parents[1] / "host_vars" / "node.yml").read_text())[
    "dcu_vllm_services"]


def refused(host, run_playbook, services, *expected):
    """serving.yml with these services fails within 30 s naming `expected`, and changes nothing."""
    before = host.check_output("systemctl show --property=MainPID --value vllm@chat-0")
    env = host.file("/etc/dcu-serving/vllm/chat-0.env").content_string
    started = time.monotonic()
    rc, out = run_playbook("serving.yml", extra_vars={"dcu_vllm_services": services})
    elapsed = time.monotonic() - started
    assert rc != 0, out[-2000:]
    for text in expected:
        assert text in out, f"{text!r} not in:\n{out[-3000:]}"
    assert elapsed < 30, f"refused after {elapsed:.1f}s"
    assert host.check_output("systemctl show --property=MainPID --value vllm@chat-0") == before
    assert host.file("/etc/dcu-serving/vllm/chat-0.env").content_string == env
    return out


def with_service(name, **changes):
    return [dict(s, **changes) if s["name"] == name else s for s in SERVICES]


def test_a_card_given_to_two_services_is_refused(host, run_playbook):
    refused(host, run_playbook, with_service("vision", cards=[1, 2, 3, 4]),
            "card 1 is given to service chat and service vision")


def test_a_layout_that_does_not_fit_is_refused_with_the_numbers(host, run_playbook):
    out = refused(host, run_playbook, with_service("chat", max_num_seqs=64), "do not fit their cards",
                  "lower max_num_seqs to")
    assert "chat-0" in out and "short" in out


def test_an_image_whose_dtk_does_not_go_with_the_driver_is_refused(host, run_playbook):
    image = "dcu-serving/vllm-sim:0.11.0-dtk24.04.3"
    host.check_output(f"printf 'FROM dcu-serving/vllm-sim:0.11.0\\nLABEL dcu-serving.dtk=24.04.3\\n' "
                      f"| docker build --quiet -t {image} -")
    refused(host, run_playbook, with_service("embed", image=image), f"image {image}", "24.04", "6.3.30")


def test_a_bundled_image_run_with_the_hosts_hyhal_is_refused(host, run_playbook):
    image = "dcu-serving/vllm-sim:0.11.0-bundled"
    host.check_output(f"printf 'FROM dcu-serving/vllm-sim:0.11.0\\nLABEL dcu-serving.runtime=bundled\\n' "
                      f"| docker build --quiet -t {image} -")
    refused(host, run_playbook, with_service("rerank", image=image),
            "built to run with nothing of the host's", "runs it as image", "set runtime: bundled")


# --- A change that passes: the canary soaks under callers' requests, then the change stays -----------------------

def test_a_changed_service_restarts_behind_a_canary_that_passes_its_soak(host, run_playbook, proxy_url):
    """embed's max_num_seqs 64 -> 32 with a 6 s canary soak while a caller sends embeddings: vllm@embed-0 restarts,
    serves the caller through the proxy for the soak, passes it, and the other services never move."""
    others = {u: host.check_output(f"systemctl show --property=MainPID --value {u}") for u in UNITS if "embed" not in u}
    stop, answered = threading.Event(), []

    def caller():
        while not stop.is_set():
            answer = requests.post(f"{proxy_url}/v1/embeddings", timeout=30, json={"model": "bge-m3", "input": "DCU"})
            answered.append(answer.status_code)
            stop.wait(0.1)

    thread = threading.Thread(target=caller)
    thread.start()
    try:
        rc, out = run_playbook("serving.yml", extra_vars={"dcu_vllm_services": with_service("embed", max_num_seqs=32),
                                                          "dcu_vllm_canary_soak": 6})
    finally:
        stop.set()
        thread.join()
    assert rc == 0, out[-3000:]
    soak = re.search(r"vllm@embed-0 passed its 6 s soak: (\d+) callers'+ requests answered", " ".join(out.split()))
    assert soak and int(soak.group(1)) > 0, out[-3000:]
    assert host.file("/etc/dcu-serving/vllm/embed-0.env").contains("--max-num-seqs 32")
    assert {u: host.check_output(f"systemctl show --property=MainPID --value {u}") for u in others} == others
    assert 200 in answered

    rc, out = run_playbook("serving.yml")  # back to the scenario's layout, no soak
    assert rc == 0, out[-3000:]
    assert "passed its" not in out, out[-3000:]  # dcu_vllm_canary_soak's default, 0: no soak
    assert host.file("/etc/dcu-serving/vllm/embed-0.env").contains("--max-num-seqs 64")
