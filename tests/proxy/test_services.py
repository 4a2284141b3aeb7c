"""A host carved into model services behind one proxy: chat on two backends, embeddings, a reranker, speech.

Real simulators serving each API in vLLM 0.11's shapes, the proxy routing by `model`, real HTTP: the OpenAI SDK
for chat, embeddings and transcriptions, plain HTTP for rerank and score.
"""

from __future__ import annotations

import io
import sys
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from proxy.proxytools import slow
from sim.simtools import DECODER, EMBEDDER, RERANKER, WHISPER

from dcu_serving.proxy import routing
from dcu_serving.proxy.balancer import Balancer
from dcu_serving.proxy.config import BackendSpec
from dcu_serving.proxy.errors import ProxyError
from support import ServerProcess, free_port, sse, wait_until

CHAT, EMBED, RERANK, SPEECH = "Qwen3-32B", "bge-m3", "bge-reranker-v2-m3", "whisper-large-v3"
QUICK = ("--sim-ttft-ms", "5", "--sim-itl-ms", "2", "--sim-itl-jitter", "0", "--sim-think-tokens", "0",
         "--sim-answer-tokens", "10")
QUERY = "What is the capital of France?"
DOCUMENTS = ["Berlin is the capital of Germany.", "The capital of France is Paris.", "Cats sleep a lot."]


def name(sim) -> str:
    return f"127.0.0.1:{sim.port}"


def services(chat: list, embed: list = (), rerank: list = (), speech: list = (), **chat_extra) -> list[dict]:
    """The proxy's `backends` in the form each backend names its models and kind."""
    entries = [{"url": s.url, "models": [CHAT], "kind": "chat", "max_model_len": 32768, **chat_extra} for s in chat]
    entries += [{"url": s.url, "models": [EMBED], "kind": "embedding", "max_model_len": 8194} for s in embed]
    entries += [{"url": s.url, "models": [RERANK], "kind": "rerank"} for s in rerank]
    entries += [{"url": s.url, "models": [SPEECH], "kind": "transcription"} for s in speech]
    return entries


# -- where a model goes: routing.unrouted, in-process --

def pools(*specs: BackendSpec) -> Balancer:
    return Balancer(list(specs), 1, 1, connect_timeout=1)


async def test_requests_no_pool_takes_are_refused_or_passed_on():
    mixed = pools(BackendSpec("http://127.0.0.1:1", (CHAT,), "chat"),
                  BackendSpec("http://127.0.0.1:2", (EMBED, "embed"), "embedding"))
    routing.configure(mixed.groups)
    assert routing.EMBEDDINGS.routes == {EMBED: mixed.by_model[EMBED], "embed": mixed.by_model[EMBED]}
    assert routing.RERANK.routes.keys() == {EMBED, "embed"}  # an embedding model scores by cosine
    assert routing.CHAT.routes.keys() == routing.COMPLETIONS.routes.keys() == {CHAT}

    def refused(api, model, passing=False):
        with pytest.raises(ProxyError) as e:
            routing.unrouted(api, model, mixed.groups, mixed.by_model, passing)
        return e.value.status, e.value.message

    assert refused(routing.CHAT, "gpt-4o") == (404, f"The model `gpt-4o` does not exist. Served here: {CHAT} "
                                                    f"(chat), {EMBED} (embedding), embed (embedding); set `model` "
                                                    f"to one of them (GET /v1/models lists them).")
    assert refused(routing.CHAT, None)[0] == 400 and refused(routing.CHAT, ["x"])[0] == 400
    assert refused(routing.TRANSCRIPTIONS, None)[1] == ("`model` is required: set it to one of the models serving "
                                                        "the Transcriptions API here: none (no model here serves "
                                                        "the Transcriptions API).")
    status, message = refused(routing.CHAT, EMBED)
    assert status == 400 and message.startswith(f"The model `{EMBED}` (embedding) does not serve the Chat "
                                                f"Completions API. Models here that do: {CHAT}. If `{EMBED}` does "
                                                f"serve the Chat Completions API (kind chat or vision), declare ")
    assert "`--backend chat=http://127.0.0.1:2` on its command line" in message
    # contract.model: pass — several pools: an unknown model has nowhere to go; a known one goes to its pool.
    assert refused(routing.CHAT, "gpt-4o", passing=True)[0] == 404
    assert routing.unrouted(routing.CHAT, EMBED, mixed.groups, mixed.by_model, True) is mixed.by_model[EMBED]
    # One pool (the plain configuration): vLLM decides, as it would without the proxy.
    single = pools(BackendSpec("http://127.0.0.1:1", (CHAT,)))
    for model in ("gpt-4o", None, 7):
        assert routing.unrouted(routing.CHAT, model, single.groups, single.by_model, True) is single.groups[0]


def wav(seconds: float, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(rate)
        w.writeframes(bytes([130]) * int(seconds * rate))
    return out.getvalue()


@pytest.fixture
def host(start_sim, start_proxy):
    """Chat on 2 backends, embeddings, a reranker and Whisper behind one proxy: (proxy, sims by role)."""
    sims = {
        "chat": [start_sim(*QUICK, served_model_name=CHAT, model_config=DECODER, wait=False) for _ in range(2)],
        "embed": [start_sim("--sim-ttft-ms", "5", served_model_name=EMBED, model_config=EMBEDDER, wait=False)],
        "rerank": [start_sim("--sim-ttft-ms", "5", served_model_name=RERANK, model_config=RERANKER, wait=False)],
        "speech": [start_sim("--sim-ttft-ms", "5", "--sim-itl-ms", "1", served_model_name=SPEECH,
                             model_config=WHISPER, wait=False)],
    }
    for group in sims.values():
        for sim in group:
            sim.wait_ready()
    proxy = start_proxy(services(sims["chat"], sims["embed"], sims["rerank"], sims["speech"]), healthy=5,
                        models=None)
    return proxy, sims


def client(proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)


def test_each_api_is_routed_to_its_models_pool(host):
    proxy, sims = host
    sdk = client(proxy)
    chat_backends = {name(s) for s in sims["chat"]}
    seen = set()
    for i in range(6):
        raw = sdk.chat.completions.with_raw_response.create(
            model=CHAT, messages=[{"role": "user", "content": "Hello"}], user=f"chat-{i}", max_tokens=8)
        assert raw.http_response.status_code == 200
        seen.add(raw.headers["X-Backend"])
        assert raw.parse().choices[0].finish_reason in ("stop", "length")
    assert seen <= chat_backends and len(seen) >= 1

    raw = sdk.embeddings.with_raw_response.create(model=EMBED, input=["one text", "another"], user="emb-1")
    assert raw.headers["X-Backend"] == name(sims["embed"][0])
    assert len(raw.parse().data) == 2 and len(raw.parse().data[0].embedding) == 1024
    embedded_tokens = raw.parse().usage.prompt_tokens

    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        r = proxy.post(path, {"model": RERANK, "query": QUERY, "documents": DOCUMENTS, "user": "rr-1"})
        assert r.status_code == 200, r.text
        assert r.headers["X-Backend"] == name(sims["rerank"][0])
        assert r.json()["results"][0]["index"] == 1  # the document that answers the query ranks first
    for path in ("/v1/score", "/score"):
        r = proxy.post(path, {"model": RERANK, "text_1": QUERY, "text_2": DOCUMENTS, "user": "sc-1"})
        assert r.status_code == 200 and r.headers["X-Backend"] == name(sims["rerank"][0])
        assert [d["index"] for d in r.json()["data"]] == [0, 1, 2]
    # An embedding model scores too (cosine of the embeddings), as vLLM does: routed to its own card.
    r = proxy.post("/v1/rerank", {"model": EMBED, "query": QUERY, "documents": DOCUMENTS})
    assert r.status_code == 200 and r.headers["X-Backend"] == name(sims["embed"][0])

    # The SDK puts `user` (extra_body) into the form, before the file: the orid of the upload.
    raw = sdk.audio.transcriptions.with_raw_response.create(model=SPEECH, file=("call.wav", wav(3)), language="en",
                                                             extra_body={"user": "asr-1"})
    assert raw.headers["X-Backend"] == name(sims["speech"][0])
    assert raw.parse().text

    lines = proxy.settled_results("asr-1")
    assert [(line["api"], line["model"], line["backend"], line["status"]) for line in lines] == \
        [("transcriptions", SPEECH, name(sims["speech"][0]), 200)]
    by_orid = {line["orid"]: line for line in proxy.results()}
    assert (by_orid["emb-1"]["api"], by_orid["emb-1"]["model"], by_orid["emb-1"]["prompt_tokens"]) == \
        ("embeddings", EMBED, embedded_tokens)
    assert by_orid["chat-0"]["api"] == "chat" and by_orid["chat-0"]["backend"] in chat_backends
    apis = [(line["api"], line["model"]) for line in proxy.results() if line["orid"] in ("rr-1", "sc-1")]
    assert apis == [("rerank", RERANK)] * 3 + [("score", RERANK)] * 2
    assert by_orid["rr-1"]["prompt_tokens"] > 0  # rerank's usage.total_tokens
    assert all(line["attempts"] == 1 and line["error"] is None for line in proxy.results()
               if not (line["orid"] or "").startswith("marker-"))

    text = requests.get(proxy.url + "/metrics", timeout=5).text
    samples = {(s.labels["api"], s.labels["model"], s.labels["status"]): s.value
               for f in text_string_to_metric_families(text) if f.name == "dcu_proxy_requests" for s in f.samples
               if s.name == "dcu_proxy_requests_total"}
    assert samples[("chat", CHAT, "200")] == 6 and samples[("embeddings", EMBED, "200")] == 1
    assert samples[("rerank", RERANK, "200")] == 3 and samples[("transcriptions", SPEECH, "200")] == 1
    assert samples[("chat", "", "404")] == 1  # settled_results' marker: an unknown model is no label value


def test_models_lb_status_and_the_requests_no_pool_takes(host):
    proxy, sims = host
    listed = requests.get(proxy.url + "/v1/models", timeout=5).json()
    assert [(m["id"], m.get("max_model_len")) for m in listed["data"]] == \
        [(CHAT, 32768), (EMBED, 8194), (RERANK, None), (SPEECH, None)]
    assert [m.id for m in client(proxy).models.list()] == [CHAT, EMBED, RERANK, SPEECH]

    status = proxy.lb_status()
    assert (status["healthy"], status["total"], status["queue"]) == (5, 5, 0)
    chat = status["models"][CHAT]
    assert {k: v for k, v in chat.items() if k not in ("speed", "queue_by_cost")} == {
        "kind": "chat", "healthy": 2, "total": 2, "active": 0, "queue": 0, "queue_policy": "cost", "queue_reserve": 0,
        "backends": [s.url for s in sims["chat"]]}
    assert chat["queue_by_cost"] == {"0-1s": 0, "1-10s": 0, "10-60s": 0, "60s+": 0}
    assert chat["speed"]["token_ms"] > 0
    assert {m: (s["kind"], s["healthy"], s["total"]) for m, s in status["models"].items()} == {
        CHAT: ("chat", 2, 2), EMBED: ("embedding", 1, 1), RERANK: ("rerank", 1, 1), SPEECH: ("transcription", 1, 1)}
    assert [(b["models"], b["kind"]) for b in status["backends"]][-1] == ([SPEECH], "transcription")

    sdk = client(proxy)
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk.embeddings.create(model="bge-m4", input="x")
    error = unknown.value.body
    assert error["type"] == "NotFoundError" and error["param"] == "model"
    assert error["message"].startswith("The model `bge-m4` does not exist. Served here: ")
    assert all(f"{m} ({k})" in error["message"] for m, k in
               ((CHAT, "chat"), (EMBED, "embedding"), (RERANK, "rerank"), (SPEECH, "transcription")))
    assert unknown.value.response.headers["X-Backend"] == "dcu-proxy"

    wrong = proxy.post("/v1/embeddings", {"model": CHAT, "input": "x"})  # vLLM would answer 200 with an error
    assert wrong.status_code == 400
    chat = sims["chat"][0].url  # the first backend of the model's pool: the one the hint names
    assert wrong.json()["error"]["message"] == (
        f"The model `{CHAT}` (chat) does not serve the Embeddings API. Models here that do: {EMBED}. If `{CHAT}` "
        f"does serve the Embeddings API (kind embedding), declare its kind to dcu-proxy: `--backend embedding={chat}` "
        f"on its command line, or in proxy.yml `kind: embedding` beside a plain `backends` list, or its entry "
        f"`{{url: {chat}, models: [{CHAT}], kind: embedding}}`.")
    missing = proxy.post("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == (f"`model` is required: set it to one of the models serving the "
                                                  f"Rerank API here: {EMBED}, {RERANK}.")
    assert all(b["served"] == 0 for b in proxy.lb_status()["backends"])  # none of these reached a card


def test_the_chat_contract_applies_to_chat_only(host):
    proxy, sims = host
    # Chat: an integer `user` is the proxy's 400, before a card spends anything.
    r = proxy.post("/v1/chat/completions", {"model": CHAT, "messages": [{"role": "user", "content": "hi"}],
                                            "user": 4711})
    assert r.status_code == 400 and r.headers["X-Backend"] == "dcu-proxy"
    assert "str(orid)" in r.json()["error"]["message"]
    # Embeddings: passed on as sent. vLLM 0.11's EmbeddingCompletionRequest has `user: str | None`, so vLLM itself
    # refuses the integer: its validation 400, from the embeddings card; the proxy logs the orid all the same.
    r = proxy.post("/v1/embeddings", {"model": EMBED, "input": "the secret document", "user": 4712})
    assert r.status_code == 400 and r.headers["X-Backend"] == name(sims["embed"][0])
    error = r.json()["error"]
    assert error["type"] == "Bad Request" and error["param"].startswith("body.") and error["param"].endswith(".user")
    # Rerank and score have no `user` field: vLLM ignores it (extra fields are allowed), the proxy logs it.
    r = proxy.post("/v1/rerank", {"model": RERANK, "query": QUERY, "documents": DOCUMENTS, "user": 4713,
                                  "enable_thinking": False})
    assert r.status_code == 200 and r.headers["X-Backend"] == name(sims["rerank"][0])
    # A top-level enable_thinking and http image URLs are no business of an embeddings request either.
    r = proxy.post("/v1/embeddings", {"model": EMBED, "enable_thinking": False, "input": "x", "user": "4714",
                                      "messages_note": "http://example.com/a.png"})
    assert r.status_code == 200, r.text

    proxy.settled_results("none")
    lines = {line["orid"]: line for line in proxy.results()}
    assert lines["4711"]["backend"] is None and lines["4711"]["status"] == 400
    assert (lines["4712"]["api"], lines["4712"]["status"], lines["4712"]["backend"]) == \
        ("embeddings", 400, name(sims["embed"][0]))
    assert "Input should be a valid string" in lines["4712"]["error"]
    assert (lines["4713"]["api"], lines["4713"]["status"]) == ("rerank", 200)
    assert "the secret document" not in proxy.results_path.read_text()  # vLLM's error quotes it; the log does not


def test_a_stopped_or_full_pool_holds_up_no_other_model(start_sim, start_proxy):
    chat = start_sim(*slow(itl_ms=40, tokens=25), served_model_name=CHAT, model_config=DECODER)
    embed = start_sim("--sim-ttft-ms", "5", served_model_name=EMBED, model_config=EMBEDDER)
    proxy = start_proxy(services([chat], [embed], concurrency=1), healthy=2, models=None, queue_size=1,
                        health={"interval": 0.2, "timeout": 0.2})
    sdk = client(proxy)
    message = {"model": CHAT, "messages": [{"role": "user", "content": "hi"}], "user": "c"}
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(proxy.chat, message)  # ~1 s on the only chat card (concurrency 1)
        wait_until(lambda: proxy.lb_status()["models"][CHAT]["active"] == 1, 10, what="chat busy")
        queued = pool.submit(proxy.chat, message)
        wait_until(lambda: proxy.lb_status()["models"][CHAT]["queue"] == 1, 10, what="chat queued")
        full = proxy.chat(message)
        assert full.status_code == 503 and f"`{CHAT}`" in full.json()["error"]["message"]
        vectors = sdk.embeddings.create(model=EMBED, input="not held up by the chat queue")
        assert vectors.data and not queued.done()  # answered while chat's queue still waits
        assert running.result().status_code == 200 and queued.result().status_code == 200

    embed.stop()
    wait_until(lambda: proxy.lb_status()["models"][EMBED]["healthy"] == 0, 10, what="embeddings card ejected")
    r = proxy.post("/v1/embeddings", {"model": EMBED, "input": "x"})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert f"no healthy backend for `{EMBED}`" in r.json()["error"]["message"]
    assert proxy.chat(message).status_code == 200  # chat still answers
    status = proxy.lb_status()
    assert (status["healthy"], status["total"]) == (1, 2)
    assert (status["models"][EMBED]["healthy"], status["models"][CHAT]["healthy"]) == (0, 1)
    assert requests.get(proxy.url + "/health", timeout=5).status_code == 200  # a model still serves


# -- uploads: multipart/form-data, the model a form field --

def form(fields: list[tuple], boundary: str = "b0undary") -> tuple[bytes, str]:
    """A multipart body in the order given: (name, value) fields and (name, filename, bytes) files."""
    out = io.BytesIO()
    for field in fields:
        out.write(f"--{boundary}\r\n".encode())
        if len(field) == 2:
            out.write(f'Content-Disposition: form-data; name="{field[0]}"\r\n\r\n{field[1]}\r\n'.encode())
        else:
            out.write(f'Content-Disposition: form-data; name="{field[0]}"; filename="{field[1]}"\r\n'
                      f"Content-Type: audio/wav\r\n\r\n".encode() + field[2] + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


@pytest.fixture
def speech(start_sim, start_proxy):
    sims = [start_sim("--sim-ttft-ms", "5", "--sim-itl-ms", "1", served_model_name=SPEECH, model_config=WHISPER,
                      wait=False) for _ in range(2)]
    for sim in sims:
        sim.wait_ready()
    proxy = start_proxy(services([], speech=sims), healthy=2, models=None, max_body_bytes=8 << 20,
                        health={"interval": 60, "timeout": 1}, log_level="debug")
    return proxy, sims


def transcribe(proxy, body: bytes, content_type: str, **kw) -> requests.Response:
    return requests.post(proxy.url + "/v1/audio/transcriptions", data=body, timeout=30,
                         headers={"Content-Type": content_type, **kw.pop("headers", {})}, **kw)


def test_uploads_in_any_field_order_whole_or_streamed(speech):
    proxy, sims = speech
    audio = wav(240)  # 1.9 MB: more than arrives with the head, so the rest is passed on as it comes
    direct = requests.post(sims[0].url + "/v1/audio/transcriptions", files={"file": ("a.wav", audio)},
                           data={"model": SPEECH, "language": "en"}, timeout=30).json()["text"]
    fields_first, ctype = form([("model", SPEECH), ("language", "en"), ("user", "ord-1"), ("file", "a.wav", audio)])
    file_first, ctype2 = form([("file", "a.wav", audio), ("model", SPEECH), ("language", "en")])  # curl -F order
    for body, content_type, headers in ((fields_first, ctype, {}), (file_first, ctype2, {"X-Orid": "ord-2"})):
        r = transcribe(proxy, body, content_type, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["text"] == direct and r.headers["X-Backend"] in {name(s) for s in sims}

    def chunks():  # no Content-Length: sent on chunked, as it arrives
        for i in range(0, len(fields_first), 256 * 1024):
            yield fields_first[i:i + 256 * 1024]
    r = transcribe(proxy, chunks(), ctype, headers={"X-Orid": "ignored: the form has user"})
    assert r.status_code == 200 and r.json()["text"] == direct
    # Fields first: the file went on to the card as it arrived, after what had come with the model (what the
    # socket held when the proxy read it: not the whole 1.9 MB); the file before the model (curl's order) had to
    # be read whole to find the model, and went as one body.
    passed_on = [int(line.split("(")[1].split()[0]) for line in proxy.tail(200).splitlines()
                 if "goes on as it arrives" in line]
    assert len(passed_on) == 2 and all(n < len(audio) for n in passed_on), passed_on

    stream = transcribe(proxy, *form([("model", SPEECH), ("stream", "true"), ("user", "ord-3"),
                                      ("file", "a.wav", wav(40))]), stream=True)
    events = sse(stream)
    assert events[-1] == "[DONE]" and events[0]["object"] == "transcription.chunk"

    proxy.settled_results("none")
    lines = [line for line in proxy.results() if line["api"] == "transcriptions"]
    assert [(line["orid"], line["status"], line["model"], line["attempts"]) for line in lines] == [
        ("ord-1", 200, SPEECH, 1), ("ord-2", 200, SPEECH, 1), ("ord-1", 200, SPEECH, 1), ("ord-3", 200, SPEECH, 1)]
    assert lines[-1]["stream"] is True and lines[-1]["finish_reason"] == "stop"
    assert not any(line["stream"] for line in lines[:3])


def test_upload_refusals(speech):
    proxy, sims = speech
    too_big, ctype = form([("model", SPEECH), ("file", "a.wav", b"\0" * (9 << 20))])
    r = transcribe(proxy, too_big, ctype)
    assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]["message"]
    r = transcribe(proxy, *form([("model", "whisper-tiny"), ("file", "a.wav", wav(1))]))
    assert r.status_code == 404 and SPEECH in r.json()["error"]["message"]
    r = transcribe(proxy, *form([("file", "a.wav", wav(1))]))
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("`model` is required")
    r = transcribe(proxy, b'{"model": "whisper-large-v3"}', "application/json")
    assert r.status_code == 400 and "multipart/form-data" in r.json()["error"]["message"]
    r = transcribe(proxy, b"no parts at all", "multipart/form-data; boundary=xyz")
    assert r.status_code == 400 and "cannot be read" in r.json()["error"]["message"]
    # vLLM's own refusal passes through: the file is over its VLLM_MAX_AUDIO_CLIP_FILESIZE_MB (25 by default)
    # only on a proxy that lets 25 MB through; here a format vLLM 0.11 does not write.
    r = transcribe(proxy, *form([("model", SPEECH), ("response_format", "srt"), ("file", "a.wav", wav(1))]))
    assert r.status_code == 400 and r.headers["X-Backend"] in {name(s) for s in sims}
    assert all(b["served"] <= 1 for b in proxy.lb_status()["backends"])


def test_an_upload_that_could_not_connect_is_retried_and_one_cut_while_sent_is_not(speech):
    proxy, (first, second) = speech
    second.proc.kill()
    second.proc.wait()
    # The health checks are a minute apart: the proxy learns of the death from the connect, and sends the
    # upload to the other card (nothing had left the proxy). Ties are random: send until one picks the dead one.
    for _ in range(20):
        r = transcribe(proxy, *form([("model", SPEECH), ("user", "retry"), ("file", "a.wav", wav(120))]))
        assert r.status_code == 200 and r.headers["X-Backend"] == name(first)
        if not proxy.backend(second)["healthy"]:
            break
    line = [line for line in proxy.settled_results("retry") if line["attempts"] == 2]
    assert len(line) == 1 and line[0]["backend"] == name(first)

    # A backend that dies while the upload is being sent: 502, and the upload is not sent again.
    requests.post(first.url + "/__sim/fault", json={"kind": "crash", "after_s": 0.5}, timeout=5)

    def slowly(body: bytes):
        yield body[:1000]
        time.sleep(1.5)
        yield body[1000:]
    r = transcribe(proxy, slowly(form([("model", SPEECH), ("user", "cut"), ("file", "a.wav", wav(60))])[0]),
                   "multipart/form-data; boundary=b0undary")
    assert r.status_code == 502, r.text
    assert "Safe to retry" in r.json()["error"]["message"]
    cut = proxy.settled_results("cut")
    assert [(line["status"], line["attempts"], line["backend"]) for line in cut] == [(502, 1, name(first))]


def test_a_deadline_passed_at_a_card_is_one_message_for_every_api(start_sim, start_proxy):
    """Chat and an upload passed on as it arrives leave the same attempt loop: the same 504, each with the advice
    that fits its API, and the card's slot back."""
    chat = start_sim(*QUICK, served_model_name=CHAT, model_config=DECODER, wait=False)
    speech = start_sim("--sim-ttft-ms", "5", served_model_name=SPEECH, model_config=WHISPER, wait=False)
    for sim in (chat, speech):
        sim.wait_ready()
    proxy = start_proxy(services([chat], speech=[speech]), healthy=2, models=None, request_timeout=1.0,
                        health={"interval": 60, "timeout": 1})
    for sim in (chat, speech):
        requests.post(sim.url + "/__sim/fault", json={"kind": "hang"}, timeout=5).raise_for_status()
    said = proxy.chat({"model": CHAT, "user": "c", "messages": [{"role": "user", "content": "hi"}]})
    upload, ctype = form([("model", SPEECH), ("user", "u"), ("file", "a.wav", wav(120))])  # passed on
    heard = transcribe(proxy, upload, ctype)
    head = "The request took longer than the proxy's 1 s deadline (request_timeout)."
    assert (said.status_code, heard.status_code) == (504, 504)
    assert said.json()["error"]["message"] == f"{head} Lower max_tokens or turn off thinking."
    assert heard.json()["error"]["message"] == f"{head} Send less per request, or retry later."
    assert heard.headers["X-Backend"] == name(speech)
    assert all(b["active"] == 0 for b in proxy.lb_status()["backends"])


def test_dcu_proxy_from_its_command_line_serves_embeddings_for_a_backend_declared_embedding(start_sim, tmp_path):
    """`dcu-proxy --backend URL` in front of an embedding model makes a chat pool, and /v1/embeddings is a 400 that
    says how to declare the kind; `--backend embedding=URL` serves it."""
    sim = start_sim("--sim-ttft-ms", "5", served_model_name=EMBED, model_config=EMBEDDER)
    command = Path(sys.executable).with_name("dcu-proxy")
    assert command.exists(), f"{command}: the console script `make venv` installs"
    # The file only turns the admin listener (127.0.0.1:8001 by default) off, so that proxies can run side by side.
    no_admin = tmp_path / "no-admin.yml"
    no_admin.write_text("admin: {listen: null}\n")

    def start(backend: str) -> ServerProcess:
        port = free_port()
        server = ServerProcess([str(command), "--config", str(no_admin), "--listen", f"127.0.0.1:{port}",
                                "--backend", backend, "--model", EMBED], port, log=tmp_path / f"proxy-{port}.log")
        started.append(server.start(ready_path="/__lb_status"))
        wait_until(lambda: requests.get(server.url + "/__lb_status", timeout=5).json()["healthy"] == 1, 15,
                   what="the embedding model healthy behind the proxy")
        return server

    def embed(proxy: ServerProcess) -> requests.Response:
        return requests.post(proxy.url + "/v1/embeddings", json={"model": EMBED, "input": ["one text", "another"]},
                             timeout=10)

    started: list[ServerProcess] = []
    try:
        plain = start(sim.url)
        refused = embed(plain)
        assert refused.status_code == 400
        message = refused.json()["error"]["message"]
        assert message.startswith(f"The model `{EMBED}` (chat) does not serve the Embeddings API.")
        assert f"`--backend embedding={sim.url}` on its command line" in message
        assert "`kind: embedding` beside a plain `backends` list" in message

        declared = start(f"embedding={sim.url}")
        answer = embed(declared)
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Backend"] == name(sim)
        assert [len(d["embedding"]) for d in answer.json()["data"]] == [1024, 1024]
        status = requests.get(declared.url + "/__lb_status", timeout=5).json()
        assert status["models"][EMBED]["kind"] == "embedding"
        chat = requests.post(declared.url + "/v1/chat/completions", timeout=10,
                             json={"model": EMBED, "messages": [{"role": "user", "content": "hi"}], "user": "u"})
        assert chat.status_code == 400 and "(embedding) does not serve the Chat Completions API" in chat.text
    finally:
        for server in started:
            server.stop()
