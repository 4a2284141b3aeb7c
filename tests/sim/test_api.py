"""The simulator's OpenAI API as a client sees it: endpoints, validation, output, streaming."""

from __future__ import annotations

import time

import openai
import pytest
import requests
from sim.simtools import body, chat, content_of, metric, metrics, png_uri

from support import FAST_SIM, SERVED_MODEL, sse

# --- service endpoints ---------------------------------------------------------------------------


def test_health_ping_version(sim):
    health = requests.get(sim.url + "/health", timeout=5)
    assert (health.status_code, health.content) == (200, b"")
    assert requests.get(sim.url + "/ping", timeout=5).status_code == 200
    assert requests.post(sim.url + "/ping", timeout=5).status_code == 200
    assert requests.get(sim.url + "/version", timeout=5).json() == {"version": "0.11.0"}


def test_models_lists_served_name_and_context_length(sim):
    models = requests.get(sim.url + "/v1/models", timeout=5).json()
    assert models["object"] == "list"
    [card] = models["data"]
    assert card["id"] == SERVED_MODEL
    assert card["max_model_len"] == 4096
    assert card["owned_by"] == "vllm"
    assert card["root"].endswith(SERVED_MODEL)


def test_unknown_route_answers_like_fastapi(sim):
    r = requests.get(sim.url + "/v1/nothing", timeout=5)
    assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})


def test_metrics_carry_vllm_names_and_labels(sim):
    assert chat(sim, body(max_tokens=5)).status_code == 200
    m = metrics(sim)
    names = {name for name, _ in m}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count"):
        assert name in names, name
    assert metric(sim, "vllm:generation_tokens_total") == 5
    assert metric(sim, "vllm:request_success_total", finished_reason="length") == 1
    assert metric(sim, "vllm:time_to_first_token_seconds_count") == 1
    assert metric(sim, "vllm:inter_token_latency_seconds_count") == 4


# --- validation: status, envelope, message -------------------------------------------------------


def error_of(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    return error


def test_user_must_be_a_string(sim):
    error = error_of(chat(sim, body(user=123)), 400)
    assert error["type"] == "Bad Request"
    assert error["param"] == "body.user"
    assert error["message"].startswith("1 validation error")
    assert "Input should be a valid string" in error["message"]
    assert chat(sim, body(user="order-123", max_tokens=3)).status_code == 200


def test_missing_messages(sim):
    error = error_of(chat(sim, {"model": SERVED_MODEL}), 400)
    assert error["param"] == "body.messages"
    assert "Field required" in error["message"]


def test_malformed_json(sim):
    error = error_of(chat(sim, '{"model": "MiniCPM-V-4.5", '), 400)
    assert "JSON decode error" in error["message"]


def test_unknown_model_is_404(sim):
    error = error_of(chat(sim, body() | {"model": "gpt-4"}), 404)
    assert error["message"] == "The model `gpt-4` does not exist."
    assert error["type"] == "NotFoundError"


def test_too_many_images(sim):
    error = error_of(chat(sim, body(images=3)), 400)
    assert error["message"] == "At most 2 image(s) may be provided in one prompt."
    assert chat(sim, body(images=2, max_tokens=3)).status_code == 200


@pytest.mark.parametrize("url, says", [
    ("data:image/png;base64,not*base64!", "invalid base64"),
    ("data:image/png;base64,aGVsbG8gd29ybGQ=", "cannot identify image file"),
    ("https://example.com/cat.png", "cannot fetch https URLs"),
])
def test_bad_images(sim, url, says):
    payload = body()
    payload["messages"][0]["content"].append({"type": "image_url", "image_url": {"url": url}})
    error = error_of(chat(sim, payload), 400)
    assert says in error["message"]
    assert error["type"] == "BadRequestError"


def test_prompt_plus_max_tokens_over_context(sim):
    error = error_of(chat(sim, body(max_tokens=4090)), 400)
    assert "maximum context length is 4096 tokens" in error["message"]
    error = error_of(chat(sim, body(text="x" * 20000)), 400)
    assert "maximum context length is 4096 tokens" in error["message"]


def test_stream_options_need_stream(sim):
    error = error_of(chat(sim, body(stream_options={"include_usage": True})), 400)
    assert "Stream options can only be defined when `stream=True`" in error["message"]


# --- output ---------------------------------------------------------------------------------------


def answer(server, **extra) -> dict:
    r = chat(server, body(**extra))
    assert r.status_code == 200, r.text
    return r.json()


def test_response_shape_and_usage(sim):
    reply = answer(sim)
    assert reply["object"] == "chat.completion"
    assert reply["id"].startswith("chatcmpl-")
    assert reply["model"] == SERVED_MODEL
    [choice] = reply["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"
    usage = reply["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens"] > 10


def test_request_id_follows_x_request_id(sim):
    reply = chat(sim, body(max_tokens=1), headers={"X-Request-Id": "orid-42"})
    assert reply.json()["id"] == "chatcmpl-orid-42"


def test_output_is_deterministic_per_request(sim):
    first = answer(sim)["choices"][0]["message"]["content"]
    assert answer(sim)["choices"][0]["message"]["content"] == first
    assert answer(sim, text="Another question.")["choices"][0]["message"]["content"] != first
    assert answer(sim, seed=7)["choices"][0]["message"]["content"] != first


def test_seed_flag_changes_the_text(start_sim, sim):
    other = start_sim(*FAST_SIM, "--sim-seed", "99")
    assert answer(other)["choices"][0]["message"]["content"] != answer(sim)["choices"][0]["message"]["content"]


def test_thinking_block_and_its_switch(sim):
    thinking = answer(sim)["choices"][0]["message"]["content"]
    assert thinking.startswith("<think>\n") and "\n</think>\n\n" in thinking
    plain = answer(sim, chat_template_kwargs={"enable_thinking": False})
    assert "<think>" not in plain["choices"][0]["message"]["content"]
    # A top-level enable_thinking is not vLLM's switch: ignored, thinking still paid for.
    ignored = answer(sim, enable_thinking=False)["choices"][0]["message"]["content"]
    assert ignored == thinking
    assert plain["usage"]["completion_tokens"] < answer(sim)["usage"]["completion_tokens"]


def test_reasoning_parser_moves_thinking_out_of_content(start_sim):
    server = start_sim(*FAST_SIM, "--reasoning-parser", "qwen3")
    message = answer(server)["choices"][0]["message"]
    assert "<think>" not in message["content"] and message["content"]
    assert message["reasoning_content"] and "<think>" not in message["reasoning_content"]


def test_max_tokens_runs_out_with_length(sim):
    reply = answer(sim, max_tokens=7)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 7
    whole = answer(sim)["choices"][0]["message"]["content"]
    assert whole.startswith(reply["choices"][0]["message"]["content"])


def test_prompt_tokens_grow_with_text_and_images(sim):
    def prompt_tokens(**kw):
        return answer(sim, max_tokens=1, **kw)["usage"]["prompt_tokens"]

    short = prompt_tokens(text="Hi.")
    assert prompt_tokens(text="Hi. " * 200) > short + 150
    one = prompt_tokens(text="Hi.", images=1)
    assert one > short
    assert prompt_tokens(text="Hi.", images=2) - one == one - short


def test_images_add_to_time_to_first_token(start_sim):
    server = start_sim(*FAST_SIM, "--sim-image-ms", "400")

    def ttft(images):
        start = time.monotonic()
        with chat(server, body(images=images, stream=True, max_tokens=2), stream=True) as r:
            next(r.iter_lines())
            return time.monotonic() - start

    assert ttft(2) - ttft(0) > 0.7


# --- streaming ------------------------------------------------------------------------------------


def test_stream_shape_like_vllm(sim):
    with chat(sim, body(stream=True, stream_options={"include_usage": True}), stream=True) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = sse(r)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == len(chunks) - 1  # one chunk per token after the role
    assert content_of(chunks) == answer(sim)["choices"][0]["message"]["content"]


def test_stream_without_include_usage_has_no_usage_chunk(sim):
    with chat(sim, body(stream=True, max_tokens=4), stream=True) as r:
        events = sse(r)
    assert events[-1] == "[DONE]"
    assert all("usage" not in e for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_openai_sdk_reads_the_simulator(sim):
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=SERVED_MODEL, messages=body()["messages"], max_tokens=5,
                                           user="orid-1")
    assert reply.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(model=SERVED_MODEL, messages=body()["messages"], stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("<think>")
    assert chunks[-1].usage.completion_tokens > 0
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=SERVED_MODEL, messages=body()["messages"], user=123)
    assert caught.value.body["param"] == "body.user"


def test_bigger_images_cost_more_prompt_tokens(sim):
    def prompt_tokens(width, height):
        payload = body(max_tokens=1)
        payload["messages"][0]["content"].append({"type": "image_url", "image_url": {"url": png_uri(width, height)}})
        r = chat(sim, payload)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    assert prompt_tokens(1344, 1344) > prompt_tokens(448, 448)
