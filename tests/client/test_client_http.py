"""The standard client against dcu-proxy in front of simulators, over real HTTP."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import threading

import openai
import pytest
from aiohttp import web
from PIL import Image

from dcu_serving.client import (
    BadRequestError,
    Client,
    Retry,
    ServiceTimeout,
    ServiceUnavailable,
    TruncatedError,
    api,
    check_service,
    recognize,
    recognize_stream,
)
from support import FAST_HEALTH, FAST_SIM, SERVED_MODEL, free_port, wait_until


def png(size=(64, 48), color="red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


@pytest.fixture
def photo(tmp_path):
    path = tmp_path / "photo.png"
    path.write_bytes(png())
    return path


def host_port(url: str) -> str:
    return url.split("://", 1)[1]


def test_recognize_strips_thinking_and_reports_where_it_ran(service, photo):
    r = recognize(photo, prompt="How many people?", orid=12345, base_url=service.url)
    assert r.answer and "<think>" not in r.answer and "</think>" not in r.answer
    assert r.thinking  # the simulator thinks unless told not to
    assert r.finish_reason == "stop" and not r.truncated
    assert r.backend in {host_port(u) for u in service.backends}
    assert r.request_id and r.prompt_tokens > 0 and r.completion_tokens > 0 and r.latency_s > 0
    logged = service.settled_results("12345")
    assert len(logged) == 1 and logged[0]["status"] == 200 and logged[0]["backend"] == r.backend


def test_thinking_off_goes_in_chat_template_kwargs(service, photo):
    on = recognize(photo, orid="o-on", base_url=service.url)
    off = recognize(photo, orid="o-off", enable_thinking=False, base_url=service.url)
    assert on.thinking and not off.thinking
    assert off.completion_tokens < on.completion_tokens


def test_truncated_answer_is_flagged_or_raised(service, photo):
    r = recognize(photo, orid="short", max_tokens=5, base_url=service.url)
    assert r.truncated and r.finish_reason == "length"
    with pytest.raises(TruncatedError, match="max_tokens=5") as caught:
        recognize(photo, orid="short-strict", max_tokens=5, strict=True, base_url=service.url)
    assert caught.value.result.truncated


def test_stream_yields_the_answer_without_thinking(service, photo):
    stream = recognize_stream(photo, orid="st-1", base_url=service.url)
    pieces = list(stream)
    assert len(pieces) > 1 and "".join(pieces).strip() == stream.result.answer
    assert "think>" not in "".join(pieces)
    assert stream.finish_reason == "stop" and stream.usage["completion_tokens"] > 0
    assert stream.result.thinking and stream.backend
    whole = recognize(photo, orid="st-2", base_url=service.url)
    assert stream.result.answer == whole.answer  # same request, same deterministic answer


def test_bad_request_is_not_retried(service, photo):
    client = Client(service.url, model="minicpm-v-4.5", retry=Retry(attempts=3, backoff_s=0.01))
    with pytest.raises(BadRequestError) as caught:
        client.recognize(photo, orid="wrong-model")
    assert caught.value.status == 404 and SERVED_MODEL in caught.value.message  # vLLM's NotFoundError
    assert caught.value.request_id
    assert len(service.settled_results("wrong-model")) == 1


def test_503_is_retried_until_a_card_comes_back(start_sim, start_proxy, photo):
    port = free_port()
    service = start_proxy([f"http://127.0.0.1:{port}"], health=FAST_HEALTH)
    sims = []

    def bring_card_back_after_first_503():
        wait_until(lambda: any(r["orid"] == "retry-me" for r in service.results()), 20,
                   what="the first 503 in the results log")
        sims.append(start_sim(*FAST_SIM, port=port))

    helper = threading.Thread(target=bring_card_back_after_first_503)
    helper.start()
    client = Client(service.url, retry=Retry(attempts=20, backoff_s=0.2, max_backoff_s=0.5))
    try:
        r = client.recognize(photo, orid="retry-me")
    finally:
        helper.join()
    statuses = [line["status"] for line in service.settled_results("retry-me")]
    assert statuses[0] == 503 and statuses[-1] == 200 and r.attempts == len(statuses) >= 2


def test_503_retries_are_bounded(start_proxy, photo):
    service = start_proxy([f"http://127.0.0.1:{free_port()}"])
    client = Client(service.url, retry=Retry(attempts=3, backoff_s=0.01, max_backoff_s=0.05))
    with pytest.raises(ServiceUnavailable) as caught:
        client.recognize(photo, orid="never")
    assert caught.value.status == 503
    assert [line["status"] for line in service.settled_results("never")] == [503, 503, 503]


def test_client_timeout_is_a_timeout(start_sim, start_proxy, photo, monkeypatch):
    slow = start_sim("--sim-ttft-ms", "3000")
    service = start_proxy([slow.url], healthy=1)
    monkeypatch.setattr(api, "_warned_short_timeout", False)
    with pytest.warns(UserWarning, match="shorter than the 120s"):
        client = Client(service.url, timeout=0.5)
    with pytest.raises(ServiceTimeout, match="client timeout"):
        client.recognize(photo, orid="slow")


def test_check_service_counts_healthy_cards(service, start_sim):
    ok, summary, ids = check_service(service.url)
    assert (ok, summary, sorted(ids)) == (True, "2/2", sorted(host_port(u) for u in service.backends))
    service.stop()
    assert check_service(service.url) == (False, "0/0", [])


@pytest.fixture
def capture_backend():
    """A backend that records request bodies and answers like vLLM; runs behind the real proxy."""
    seen: list[dict] = []

    async def health(_):
        return web.Response()

    async def chat(request):
        seen.append(await request.json())
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "model": SERVED_MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes([web.get("/health", health), web.post("/v1/chat/completions", chat)])
    port = free_port()
    ready = threading.Event()

    def serve():
        import asyncio

        loop = asyncio.new_event_loop()
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()

    threading.Thread(target=serve, daemon=True).start()
    ready.wait(5)
    return f"http://127.0.0.1:{port}", seen


def sent_image(body: dict, n: int = 0) -> tuple[str, Image.Image]:
    url = [p for p in body["messages"][0]["content"] if p["type"] == "image_url"][n]["image_url"]["url"]
    head, _, data = url.partition(",")
    return head, Image.open(io.BytesIO(base64.b64decode(data)))


def test_what_reaches_the_card(capture_backend, start_proxy, tmp_path):
    url, seen = capture_backend
    service = start_proxy([url], healthy=1)
    jpg_named_png = tmp_path / "scan.jpg"
    jpg_named_png.write_bytes(png())
    strip = png(size=(1000, 100), color="black")
    recognize([jpg_named_png, strip], orid=987, enable_thinking=False, base_url=service.url)
    body = seen[-1]
    assert body["user"] == "987" and body["chat_template_kwargs"] == {"enable_thinking": False}
    head, img = sent_image(body, 0)
    assert head == "data:image/png;base64" and img.format == "PNG"  # from the bytes, not the name
    _, padded = sent_image(body, 1)
    assert padded.size == (1000, 334)  # 10:1 padded to 3:1


def run_cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dcu_serving.client.cli", *args],
                          capture_output=True, text=True, env=env, timeout=60)


def test_cli_answers_and_exit_codes(service, photo, start_proxy):
    ok = run_cli(str(photo), "--orid", "cli-1", "--json", "--url", service.url)
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert result["answer"] and result["backend"] and result["orid"] == "cli-1"
    assert result["finish_reason"] == "stop" and result["completion_tokens"] > 0

    check = run_cli("--check", "--url", service.url)
    assert check.returncode == 0 and check.stdout.splitlines()[0] == "healthy 2/2"

    bad = run_cli(str(photo), "--model", "nope", "--url", service.url)
    assert bad.returncode == 3 and "BadRequestError" in bad.stderr

    down = start_proxy([f"http://127.0.0.1:{free_port()}"])
    assert run_cli("--check", "--url", down.url).returncode == 4
    notimage = photo.with_suffix(".txt")
    notimage.write_text("hello")
    assert run_cli(str(notimage), "--url", service.url).returncode == 3


def test_cli_check_reports_degraded(service, start_sim, start_proxy):
    live = start_sim(*FAST_SIM)
    degraded = start_proxy([live.url, f"http://127.0.0.1:{free_port()}"], healthy=1)
    out = run_cli("--check", "--url", degraded.url)
    assert out.returncode == 1 and out.stdout.startswith("healthy 1/2")


def test_openai_sdk_works_unchanged(service, photo):
    client = openai.OpenAI(base_url=service.url + "/v1", api_key="unused", timeout=120)
    uri = "data:image/png;base64," + base64.b64encode(photo.read_bytes()).decode()
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": "What is this?"}]}]
    done = client.chat.completions.create(model=SERVED_MODEL, messages=messages, max_tokens=256, user="sdk-1")
    assert done.choices[0].message.content and done.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=SERVED_MODEL, messages=messages, max_tokens=256,
                                                 user="sdk-2", stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices[0].finish_reason == "stop"
    assert [r["status"] for r in service.settled_results("sdk-2")] == [200]
