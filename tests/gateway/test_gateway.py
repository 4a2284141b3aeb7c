"""The gateway for real: LiteLLM's proxy (build/gateway-venv, `make gateway`) with this project's auth and caller
hook, in front of a real dcu-proxy and two simulated cards, driven by the official openai SDK: a chat with the
caller's alias in the host's results log, 401 for a wrong key, 429 past a caller's rpm and past its concurrent.

Outside connections: LiteLLM runs under `strace -f -e trace=connect,sendto,sendmsg`, and every address any of its
processes and threads connected or sent to is read: each must be the loopback (the dcu-proxy, itself) or a local
socket. A DNS lookup, a cost-map fetch or telemetry would show as another address.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
import wave
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import requests
import yaml

from dcu_serving.gateway.config import gateway_config
from support import FAST_SIM, REPO, SERVED_MODEL, ServerProcess, free_port, wait_until

pytestmark = pytest.mark.gateway

LITELLM = os.environ.get("DCU_LITELLM", str(REPO / "build/gateway-venv/bin/litellm"))
KEYS = {"billing": "sk-billing-0123456789", "batch": "sk-batch-0123456789", "solo": "sk-solo-0123456789",
        "probe": "sk-probe-0123456789"}
# What the gateway proves itself with to each dcu-proxy (its deployments' api_key, from its environment).
PROXY_SECRET = "gw-proxy-secret-0123456789"
BATCH_RPM = 3


@dataclass
class Gateway(ServerProcess):
    trace: Path | None = None

    def start(self, ready_path="/health/liveliness", timeout=120.0):
        out = open(self.log, "ab")  # noqa: SIM115
        # Its own session: strace, LiteLLM and its workers are stopped together.
        self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                     start_new_session=True)
        self.wait_ready(ready_path, timeout)
        return self

    def stop(self, timeout=20.0):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def addresses(self) -> list[str]:
        """Every internet address LiteLLM's processes connected or sent to (local sockets left out)."""
        return re.findall(r"sa_family=AF_INET6?, [^}]*", self.trace.read_text())


@pytest.fixture
def fleet(tmp_path, start_sim, start_proxy):
    if not Path(LITELLM).exists():
        pytest.fail(f"{LITELLM} is missing: build the gateway's venv with `make gateway`")
    # Answers take ~0.3 s (10 tokens at 30 ms): long enough for requests sent together to overlap.
    cards = [start_sim(*FAST_SIM, "--sim-itl-ms", "30"), start_sim(*FAST_SIM, "--sim-itl-ms", "30")]
    port = free_port()
    # The host trusts the gateway's address (the loopback's 127.0.0.1, where LiteLLM connects from) and its secret.
    proxy = start_proxy([c.url for c in cards], healthy=2,
                        gateway={"url": f"http://127.0.0.1:{port}", "allow": ["127.0.0.1"], "secret": PROXY_SECRET})
    config = gateway_config([{"name": "host1", "url": proxy.url, "models": [SERVED_MODEL]}])
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"callers": [
        {"alias": "billing", "sha256": hashlib.sha256(KEYS["billing"].encode()).hexdigest(), "concurrent": 8},
        {"alias": "batch", "sha256": hashlib.sha256(KEYS["batch"].encode()).hexdigest(), "rpm": BATCH_RPM},
        {"alias": "solo", "sha256": hashlib.sha256(KEYS["solo"].encode()).hexdigest(), "concurrent": 1},
        {"alias": "probe", "sha256": hashlib.sha256(KEYS["probe"].encode()).hexdigest(), "probe": True},
    ]}))
    keys.chmod(0o600)
    trace = tmp_path / "network.trace"
    gateway = Gateway(
        ["strace", "-f", "-qq", "-e", "trace=connect,sendto,sendmsg", "-o", str(trace),
         LITELLM, "--config", str(tmp_path / "gateway.yaml"), "--host", "127.0.0.1", "--port", str(port),
         "--num_workers", "1"],
        port, log=tmp_path / "gateway.log", trace=trace,
        env={"LITELLM_MASTER_KEY": "sk-master-test-0123456789", "DCU_GATEWAY_KEYS": str(keys),
             "DCU_GATEWAY_PROXY_SECRET": PROXY_SECRET, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
             "NO_PROXY": "*"})
    try:
        gateway.start()
        yield gateway, proxy, cards
    finally:
        gateway.stop()


def client(gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_callers_reach_the_cards_by_key_with_their_alias_and_limits_and_nothing_leaves(fleet):
    gateway, proxy, cards = fleet

    # A chat answered by a card; the host's results line names the card and the caller.
    chat = client(gateway, KEYS["billing"]).chat.completions.create(
        model=SERVED_MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=16)
    assert chat.choices[0].message.content
    [line] = proxy.results(1)
    assert line["status"] == 200 and line["caller"] == "billing"
    assert line["backend"] in {f"127.0.0.1:{c.port}" for c in cards}

    # A key the gateway does not know: 401, and nothing reached the host.
    with pytest.raises(openai.AuthenticationError) as refused:
        client(gateway, "sk-nobody").chat.completions.create(
            model=SERVED_MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=16)
    assert refused.value.status_code == 401

    # A caller over its requests per minute: 429 once its BATCH_RPM are used, while other callers go on.
    batch = client(gateway, KEYS["batch"])
    statuses = []
    for _ in range(BATCH_RPM + 2):
        try:
            batch.chat.completions.create(model=SERVED_MODEL, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=8)
            statuses.append(200)
        except openai.RateLimitError as e:
            statuses.append(e.status_code)
    assert statuses == [200] * BATCH_RPM + [429, 429]
    assert client(gateway, KEYS["billing"]).chat.completions.create(
        model=SERVED_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8).choices

    # A caller allowed one request in flight: of three sent together, one is answered and the others get 429.
    def solo(_):
        try:
            client(gateway, KEYS["solo"]).chat.completions.create(
                model=SERVED_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
            return 200
        except openai.RateLimitError as e:
            return e.status_code
    with ThreadPoolExecutor(3) as pool:
        together = sorted(pool.map(solo, range(3)))
    assert together[0] == 200 and together[-1] == 429, together
    assert solo(None) == 200  # its slot is free again once the answer is done

    lines = proxy.results(2 + BATCH_RPM + together.count(200) + 1)
    assert sorted(rec["caller"] for rec in lines) == sorted(
        ["billing"] * 2 + ["batch"] * BATCH_RPM + ["solo"] * (together.count(200) + 1))
    assert all(rec["status"] == 200 for rec in lines)  # refused callers never reached the host

    # No request content in the gateway's output.
    assert "Hello" not in gateway.tail(10_000)
    # Every connection LiteLLM opened stayed on this machine.
    addresses = gateway.addresses()
    assert any(f"htons({proxy.port})" in a for a in addresses), addresses  # the trace sees its real traffic
    outside = [a for a in addresses if '"127.0.0.1"' not in a and '"::1"' not in a]
    assert outside == [], outside


@pytest.fixture
def two_hosts(tmp_path, start_sim, start_proxy):
    """LiteLLM in front of two hosts (a dcu-proxy and a simulated card each), with a drained-hosts file."""
    if not Path(LITELLM).exists():
        pytest.fail(f"{LITELLM} is missing: build the gateway's venv with `make gateway`")
    port = free_port()
    trust = {"url": f"http://127.0.0.1:{port}", "allow": ["127.0.0.1"], "secret": PROXY_SECRET}
    hosts = {name: start_proxy([start_sim(*FAST_SIM, "--sim-itl-ms", "10").url], healthy=1, gateway=trust)
             for name in ("host1", "host2")}
    drained = tmp_path / "drained.json"
    gateway = plain_gateway(tmp_path, port, [{"name": n, "url": p.url, "models": [SERVED_MODEL]}
                                             for n, p in hosts.items()], {"DCU_GATEWAY_DRAINED": str(drained)})
    try:
        gateway.start()
        yield gateway, hosts, drained
    finally:
        gateway.stop()


def plain_gateway(tmp_path, port: int, hosts: list[dict], env: dict | None = None,
                  settings: dict | None = None, callers: list[dict] | None = None) -> Gateway:
    """LiteLLM (not started, no strace) in front of `hosts` ({name, url, models}), with billing's and probe's keys
    (and `callers`' entries, each {alias, ...limits} with its key from KEYS)."""
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(gateway_config(hosts, settings)))
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"callers": [
        {"alias": "billing", "sha256": hashlib.sha256(KEYS["billing"].encode()).hexdigest()},
        {"alias": "probe", "sha256": hashlib.sha256(KEYS["probe"].encode()).hexdigest(), "probe": True},
        *({**c, "sha256": hashlib.sha256(KEYS[c["alias"]].encode()).hexdigest()} for c in callers or [])]}))
    return Gateway([LITELLM, "--config", str(tmp_path / "gateway.yaml"), "--host", "127.0.0.1", "--port", str(port),
                    "--num_workers", "1"], port, log=tmp_path / "gateway.log",
                   env={"LITELLM_MASTER_KEY": "sk-master-test-0123456789", "DCU_GATEWAY_KEYS": str(keys),
                        "DCU_GATEWAY_PROXY_SECRET": PROXY_SECRET, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                        "LITELLM_LOG": "ERROR", "NO_PROXY": "*", **(env or {})})


def test_a_drained_host_gets_no_request_and_health_names_each_host(two_hosts):
    from dcu_serving.gateway.drained import update

    gateway, hosts, drained = two_hosts
    app = client(gateway, KEYS["billing"])

    def chats(n):  # 4 at a time: least-busy spreads requests in flight together over the hosts
        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(lambda _: app.chat.completions.create(
                model=SERVED_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4).choices, range(n)))
    # Least-busy breaks ties by order: only requests in flight together reach the second host. Under a loaded
    # machine a batch may not overlap, so batches go until both hosts have answered (a deadline, not a count).
    sent = []

    def both_answered():
        chats(4)
        sent.append(4)
        return all(hosts[n].results() for n in hosts)
    wait_until(both_answered, 60, interval=0, what="both hosts answering requests sent 4 at a time")
    # The results log is written by a thread: every answered request logged before counting what comes after.
    wait_until(lambda: sum(len(hosts[n].results()) for n in hosts) == sum(sent), 10, interval=0.05,
               what="every answered request in the hosts' results logs")

    update(str(drained), "host1", True)
    before = len(hosts["host1"].results())
    chats(12)
    hosts["host2"].results(12, timeout=10)
    assert len(hosts["host1"].results()) == before, "a drained host got requests"

    # LiteLLM's health of each deployment: one small completion straight to the host, drained or not, carrying the
    # gateway's secret (verify.yml's gateway play). A probe key may ask; a caller's key may not (403).
    for name in hosts:
        url = f"{gateway.url}/health?model_id={name}/{SERVED_MODEL}"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Bearer {KEYS['billing']}"}),
                                   timeout=60)
        assert refused.value.code == 403 and b"inference paths only" in refused.value.read()
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEYS['probe']}"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            health = json.loads(answer.read())
        assert health["healthy_count"] == 1, health
        assert [e.get("model_id") for e in health["healthy_endpoints"]] == [f"{name}/{SERVED_MODEL}"]

    update(str(drained), "host1", False)
    before = len(hosts["host1"].results())
    chats(8)
    assert len(hosts["host1"].results()) > before  # back in the rotation


def test_a_host_whose_proxy_is_down_costs_one_failed_request_then_is_left_out(two_hosts):
    """LiteLLM answers a refused connection with a 500 it does not retry; without the hook each caller met it until
    allowed_fails + 1 (4) failures cooled the host down. The hook leaves the host out at its first refusal."""
    gateway, hosts, _ = two_hosts
    app = client(gateway, KEYS["billing"])
    hosts["host1"].stop()  # least-busy breaks ties by order: host1 is tried first

    def attempt():
        try:
            app.chat.completions.create(model=SERVED_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
            return 200
        except openai.APIStatusError as e:
            return e.status_code

    outcomes = [attempt() for _ in range(12)]
    assert outcomes == [500] + [200] * 11, outcomes
    hosts["host2"].results(11, timeout=10)  # every answered request was host2's


def test_the_benchmark_measures_through_the_gateway_as_a_caller(fleet, tmp_path):
    """playbooks/benchmark.yml's path where there is a gateway: dcu-benchmark (real aiperf, `make loadgen`) against
    the gateway with a caller's key handed over in the environment. Every request is answered and logged by the
    host under the caller's alias; the key is in nothing the benchmark wrote."""
    aiperf = os.environ.get("DCU_AIPERF")
    if not aiperf:
        pytest.fail("DCU_AIPERF is not set: `make loadgen` builds build/loadgen-venv (aiperf and dcu-serving) and "
                    "DCU_AIPERF=build/loadgen-venv/bin/aiperf points the tests at it")
    gateway, proxy, _ = fleet
    out = tmp_path / "bench"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the venv's own dcu-serving
    # Any attempt to reach the internet (the hub, tiktoken's download) goes to a closed local port and fails.
    env |= {"BENCH_CALLER_KEY": KEYS["billing"], "HTTP_PROXY": "http://127.0.0.1:9",
            "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1,localhost", "HF_ENDPOINT": "http://127.0.0.1:9"}
    done = subprocess.run(
        [str(Path(aiperf).with_name("dcu-benchmark")), "--url", gateway.url, "--model", SERVED_MODEL,
         "--api-key", "BENCH_CALLER_KEY", "--out", str(out), "--concurrency", "1,2", "--requests-per-level", "4",
         "--image-width", "256", "--image-height", "192", "--output-tokens", "8", "--stream"],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    assert [(lv["concurrency"], lv["requests"], lv["errors"]) for lv in results["levels"]] == [(1, 4, 0), (2, 4, 0)]
    assert results["settings"]["url"] == gateway.url
    answered = [r for r in proxy.results() if r["api"] == "chat" and r["status"] == 200]
    assert len(answered) >= 8 and {r["caller"] for r in answered} == {"billing"}, answered
    written = [p for p in out.rglob("*") if p.is_file()]
    assert written and not [p for p in written if KEYS["billing"].encode() in p.read_bytes()]
    assert KEYS["billing"] not in done.stdout + done.stderr


# --- speech through the gateway ----------------------------------------------------------------------------------

TTS, ASR = "CosyVoice3-0.5B", "whisper-large-v3"


@pytest.fixture
def speech_fleet(tmp_path, start_sim, start_proxy):
    """LiteLLM in front of one host serving a TTS model (the simulator as vLLM-Omni, /v1/audio/speech) and Whisper."""
    if not Path(LITELLM).exists():
        pytest.fail(f"{LITELLM} is missing: build the gateway's venv with `make gateway`")
    from sim.simtools import WHISPER

    tts = start_sim("--omni", "--sim-ttft-ms", "5", "--sim-itl-ms", "1", served_model_name=TTS,
                    model_config={"architectures": ["CosyVoice3ForConditionalGeneration"]})
    asr = start_sim("--sim-ttft-ms", "5", "--sim-itl-ms", "1", served_model_name=ASR, model_config=WHISPER)
    port = free_port()
    proxy = start_proxy([{"url": tts.url, "models": [TTS], "kind": "speech"},
                         {"url": asr.url, "models": [ASR], "kind": "transcription"}], healthy=2, models=None,
                        gateway={"url": f"http://127.0.0.1:{port}", "allow": ["127.0.0.1"], "secret": PROXY_SECRET})
    gateway = plain_gateway(tmp_path, port, [{"name": "host1", "url": proxy.url, "models": [TTS, ASR],
                                              "kinds": {TTS: "speech", ASR: "transcription"}}])
    try:
        gateway.start()
        yield gateway, proxy, tts, asr
    finally:
        gateway.stop()


def test_a_caller_synthesises_and_transcribes_speech_through_the_gateway(speech_fleet):
    gateway, proxy, tts, asr = speech_fleet
    app = client(gateway, KEYS["billing"])
    audio = app.audio.speech.create(model=TTS, voice="vivian", input="The report is due on Friday.").content
    with wave.open(io.BytesIO(audio)) as w:  # a WAV a decoder accepts, whole
        assert (w.getnchannels(), w.getframerate()) == (1, 24000) and w.getnframes() > 24000
    text = app.audio.transcriptions.create(model=ASR, file=("speech.wav", audio), language="en").text
    assert text.endswith("."), text
    records = proxy.results(2)
    # LiteLLM 1.106.12 sends an OpenAI-compatible deployment's audio calls without the request's extra_headers
    # (litellm/main.py: speech() reads them and never passes them on; transcription() passes them to Azure only), so
    # the caller hook's X-Caller does not reach the host for audio (docs/fleet.md). The gateway's secret does.
    assert [(r["api"], r["model"], r["status"], r["caller"]) for r in records] == [
        ("speech", TTS, 200, None), ("transcriptions", ASR, 200, None)]
    assert [r["backend"] for r in records] == [f"127.0.0.1:{tts.port}", f"127.0.0.1:{asr.port}"]
    with pytest.raises(openai.AuthenticationError):  # no key, no speech: nothing reached the host
        client(gateway, "sk-nobody").audio.speech.create(model=TTS, voice="vivian", input="Hello.")
    assert len(proxy.results()) == 2  # LiteLLM refused it before any call to the host

    # LiteLLM's health of each audio deployment (verify.yml's gateway play) asks it in its own API: a speech model
    # is probed with a synthesis, Whisper with a transcription, not with a chat (the config's model_info.mode).
    for model in (TTS, ASR):
        request = urllib.request.Request(f"{gateway.url}/health?model_id=host1/{model}",
                                         headers={"Authorization": f"Bearer {KEYS['probe']}"})
        try:
            answer = urllib.request.urlopen(request, timeout=60)
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{model}: {e.code} {e.read()[:3000]!r}") from None
        health = json.loads(answer.read())
        assert health["healthy_count"] == 1, health



# --- MinerU's API through the gateway ----------------------------------------------------------------------------

LIMIT_MB = 1  # the host's dcu_mineru_max_upload_mb


@pytest.fixture
def mineru_fleet(tmp_path, start_sim, start_proxy):
    """LiteLLM with MinerU's pass-through (gateway_config's `mineru`) in front of one host whose dcu-proxy serves
    MinerU (an aiohttp stub of its API, tests/proxy/test_mineru.py) at its entrance, over TLS verified with the
    hosts' CA, as a fleet runs it (dcu_proxy_tls)."""
    if not Path(LITELLM).exists():
        pytest.fail(f"{LITELLM} is missing: build the gateway's venv with `make gateway`")
    from proxy.test_mineru import StubMinerU
    from proxy.test_tls import LabCA

    lab = LabCA(tmp_path)
    cert, key = lab.issue(2)
    stub = StubMinerU()
    port, tls_port = free_port(), free_port()
    proxy = start_proxy([start_sim(*FAST_SIM).url], healthy=1,
                        mineru={"url": stub.url, "max_upload_mb": LIMIT_MB, "concurrency": 2, "timeout": 60},
                        tls={"listen": f"127.0.0.1:{tls_port}", "cert": str(cert), "key": str(key)},
                        gateway={"url": f"http://127.0.0.1:{port}", "allow": ["127.0.0.1"], "secret": PROXY_SECRET})
    host = {"name": "host1", "url": f"https://127.0.0.1:{tls_port}", "models": [SERVED_MODEL],
            "mineru": {"max_upload_mb": LIMIT_MB, "timeout": 60}}
    gateway = plain_gateway(tmp_path, port, [host], settings={
        "mineru": True, "public_url": f"http://127.0.0.1:{port}", "hosts_ca": str(lab.path)},
        callers=[{"alias": "batch", "rpm": BATCH_RPM}, {"alias": "solo", "concurrent": 1}])
    try:
        gateway.start()
        yield gateway, proxy, stub
    finally:
        gateway.stop()
        stub.hold.set()
        stub.stop()


def mineru_post(gateway, path: str, key: str | None, document: bytes, headers: dict | None = None,
                **form) -> requests.Response:
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(f"{gateway.url}/mineru/host1{path}", headers={**auth, **(headers or {})}, timeout=60,
                         files=[("files", ("invoice.pdf", document, "application/pdf"))],
                         data={"backend": "vlm-http-client", "return_md": "true", **form})


def mineru_get(url: str, key: str, **kwargs) -> requests.Response:
    return requests.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=60, **kwargs)


def test_a_caller_parses_a_document_through_the_gateway_under_its_alias(mineru_fleet):
    from proxy.test_mineru import DOCUMENT, MARKDOWN

    gateway, proxy, stub = mineru_fleet
    # A caller who names itself, directly or by LiteLLM's x-pass- forwarding, is still named by its key.
    r = mineru_post(gateway, "/file_parse", KEYS["billing"], DOCUMENT,
                    headers={"X-Caller": "mallory", "x-pass-x-caller": "mallory", "x-pass-x-mineru-entrance": "x"})
    assert r.status_code == 200, r.text
    assert r.json()["results"]["doc"]["md_content"] == MARKDOWN
    (seen,) = stub.received
    assert seen["files"] == DOCUMENT  # the whole upload, unchanged, re-encoded by LiteLLM
    assert seen["headers"].getall("X-Caller") == ["billing"]
    # The gateway's secret stops at dcu-proxy; the caller's key stops at the gateway.
    sent = "\n".join(f"{k}: {v}" for k, v in seen["headers"].items())
    assert PROXY_SECRET not in sent and KEYS["billing"] not in sent and "authorization" not in sent.lower()
    (line,) = proxy.results(1)
    assert (line["api"], line["status"], line["caller"]) == ("parse", 200, "billing")

    # A zip result comes back whole, its task's URLs at the gateway's path to this host.
    r = mineru_post(gateway, "/file_parse", KEYS["billing"], DOCUMENT, response_format_zip="true")
    assert r.status_code == 200 and r.content == stub.zip
    task_id = r.headers["X-MinerU-Task-Id"]
    assert r.headers["X-MinerU-Task-Result-Url"] == f"{gateway.url}/mineru/host1/tasks/{task_id}/result"

    # A wrong key, or none: 401 from the gateway, nothing reaches the host.
    for key in ("sk-nobody", None):
        r = mineru_post(gateway, "/file_parse", key, DOCUMENT)
        assert r.status_code == 401, r.text
    assert len(stub.received) == 2 and len(proxy.results()) == 2

    # Over the host's limit: the gateway's 413 names it, and nothing reaches the host - declared or chunked.
    big = b"%PDF-1.4 " + b"x" * ((LIMIT_MB << 20) + 1)
    r = mineru_post(gateway, "/file_parse", KEYS["billing"], big)
    assert r.status_code == 413, r.text
    message = r.json()["error"]["message"]
    assert f"limit of {LIMIT_MB} MiB" in message and "dcu_mineru_max_upload_mb" in message, message
    assert "Nothing was sent to the host" in message  # the gateway's refusal, not the host's (which says the same)
    boundary = "b0undary"

    def chunked():  # no Content-Length: the gateway counts the parts it read
        yield (f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="big.pdf"\r\n'
               f"Content-Type: application/pdf\r\n\r\n").encode()
        for start in range(0, len(big), 256 << 10):
            yield big[start:start + (256 << 10)]
        yield f"\r\n--{boundary}--\r\n".encode()
    r = requests.post(f"{gateway.url}/mineru/host1/file_parse", data=chunked(), timeout=60,
                      headers={"Authorization": f"Bearer {KEYS['billing']}",
                               "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 413 and "Nothing was sent to the host" in r.text, r.text
    # The host's results log is written by a thread: one more parse, then every line is there - none for the 413s.
    assert mineru_post(gateway, "/file_parse", KEYS["billing"], DOCUMENT).status_code == 200
    assert [(rec["status"], rec["caller"]) for rec in proxy.results(3)] == [(200, "billing")] * 3
    assert len(stub.received) == 3

    # MinerU's health through the gateway, to any caller.
    health = mineru_get(f"{gateway.url}/mineru/host1/health", KEYS["billing"])
    assert health.status_code == 200 and health.json()["status"] == "healthy"


def test_a_task_submitted_through_the_gateway_is_read_back_through_it(mineru_fleet):
    from proxy.test_mineru import DOCUMENT, MARKDOWN

    gateway, proxy, stub = mineru_fleet
    stub.hold.clear()  # the task stays processing until released
    r = mineru_post(gateway, "/tasks", KEYS["billing"], DOCUMENT)
    assert r.status_code == 202, r.text
    task = r.json()
    at = f"{gateway.url}/mineru/host1/tasks/{task['task_id']}"
    assert (task["status_url"], task["result_url"]) == (at, at + "/result")  # the gateway's, not the host's
    assert stub.received[0]["headers"]["X-Caller"] == "billing"

    not_ready = mineru_get(task["result_url"], KEYS["billing"])
    assert not_ready.status_code == 202 and not_ready.json()["status"] in ("pending", "processing")
    # Another caller's key reaches the gateway, not this task (dcu-proxy knows its submitter by X-Caller).
    assert mineru_get(task["status_url"], KEYS["probe"]).status_code == 404
    stub.hold.set()
    wait_until(lambda: mineru_get(task["status_url"], KEYS["billing"]).json()["status"] == "completed", 30,
               interval=0.1, what="the task completed, as read through the gateway")
    result = mineru_get(task["result_url"], KEYS["billing"])
    assert result.status_code == 200, result.text
    assert result.json()["results"]["invoice"]["md_content"] == MARKDOWN

    # A task whose result is a zip: passed on as it comes, whole.
    r = mineru_post(gateway, "/tasks", KEYS["billing"], DOCUMENT, response_format_zip="true")
    assert r.status_code == 202, r.text
    url = r.json()["result_url"]
    wait_until(lambda: mineru_get(url, KEYS["billing"]).status_code == 200, 30, interval=0.1,
               what="the zip task's result, through the gateway")
    with mineru_get(url, KEYS["billing"], stream=True) as zipped:
        assert zipped.headers["Content-Type"] == "application/zip"
        assert b"".join(zipped.iter_content(64 << 10)) == stub.zip
    records = [(rec["api"], rec["caller"]) for rec in proxy.results() if rec["api"] != "parse_status"]
    assert set(records) == {("parse_task", "billing"), ("parse_result", "billing")}, records


def test_a_host_the_gateway_cannot_verify_gets_no_document(tmp_path, start_sim, start_proxy):
    """The hosts' CA (ssl_verify) holds for the pass-through too: a host presenting a certificate of another CA is
    not sent the upload."""
    from proxy.test_mineru import DOCUMENT, StubMinerU
    from proxy.test_tls import LabCA

    (tmp_path / "other").mkdir()
    lab, other = LabCA(tmp_path), LabCA(tmp_path / "other")
    cert, key = other.issue(2)
    stub = StubMinerU()
    port, tls_port = free_port(), free_port()
    start_proxy([start_sim(*FAST_SIM).url], healthy=1, mineru={"url": stub.url},
                tls={"listen": f"127.0.0.1:{tls_port}", "cert": str(cert), "key": str(key)},
                gateway={"url": f"http://127.0.0.1:{port}", "allow": ["127.0.0.1"], "secret": PROXY_SECRET})
    gateway = plain_gateway(tmp_path, port, [{"name": "host1", "url": f"https://127.0.0.1:{tls_port}",
                                              "models": [SERVED_MODEL], "mineru": {"max_upload_mb": 10}}],
                            settings={"mineru": True, "public_url": f"http://127.0.0.1:{port}",
                                      "hosts_ca": str(lab.path)})
    try:
        gateway.start()
        r = mineru_post(gateway, "/file_parse", KEYS["billing"], DOCUMENT)
        assert r.status_code >= 500 and "certificate verify failed" in r.text.lower(), r.text
        assert stub.received == []
    finally:
        gateway.stop()
        stub.stop()


def test_a_callers_limits_hold_for_minerus_api_too(mineru_fleet):
    """custom_auth's limits (LiteLLM's limiter, a pre-call hook that pass-throughs run): past its rpm a caller gets
    429 and the host nothing; a caller allowed one request in flight gets its slot back after each parse."""
    from proxy.test_mineru import DOCUMENT

    gateway, proxy, stub = mineru_fleet
    stub.hold.clear()  # solo's first parse stays at MinerU: a second one while it is there is refused
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(mineru_post, gateway, "/file_parse", KEYS["solo"], DOCUMENT)
        wait_until(lambda: stub.active == 1, 30, interval=0.05, what="solo's first parse at MinerU")
        second = mineru_post(gateway, "/file_parse", KEYS["solo"], DOCUMENT)
        stub.hold.set()
        assert (first.result().status_code, second.status_code) == (200, 429), second.text
    assert [mineru_post(gateway, "/file_parse", KEYS["solo"], DOCUMENT).status_code for _ in range(2)] == [200] * 2
    statuses = [mineru_post(gateway, "/file_parse", KEYS["batch"], DOCUMENT).status_code for _ in range(BATCH_RPM + 1)]
    assert statuses == [200] * BATCH_RPM + [429], statuses
    assert mineru_post(gateway, "/file_parse", KEYS["billing"], DOCUMENT).status_code == 200  # others go on
    records = proxy.results(3 + BATCH_RPM + 1)
    assert [r["caller"] for r in records] == ["solo"] * 3 + ["batch"] * BATCH_RPM + ["billing"]
    assert len(stub.received) == 3 + BATCH_RPM + 1
