"""/v1/completions (vLLM's text completion API) as a client sees it: batches, token-id prompts, streams."""

from __future__ import annotations

import json

import openai
import requests
from sim.simtools import metric

from support import SERVED_MODEL, sse


def complete(server, payload, headers: dict | None = None, **kw) -> requests.Response:
    return requests.post(server.url + "/v1/completions", data=json.dumps(payload), timeout=10,
                         headers={"Content-Type": "application/json", **(headers or {})}, **kw)


def text_body(prompt="The invoice number is", **extra) -> dict:
    return {"model": SERVED_MODEL, "prompt": prompt, **extra}


def test_answer_is_a_text_completion_with_usage(sim):
    r = complete(sim, text_body(max_tokens=5), headers={"X-Request-Id": "order-7"})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["id"] == "cmpl-order-7"
    assert (answer["object"], answer["model"]) == ("text_completion", SERVED_MODEL)
    [choice] = answer["choices"]
    assert (choice["index"], choice["finish_reason"], choice["logprobs"]) == (0, "length", None)
    assert choice["text"] and "<think>" not in choice["text"]  # no chat template: no thinking block
    usage = answer["usage"]
    # "The invoice number is": 21 bytes, about 4 bytes a token, and no chat template markers
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (6, 5, 11)


def test_max_tokens_defaults_to_16_as_in_vllm(start_sim):
    sim = start_sim("--sim-ttft-ms", "0", "--sim-itl-ms", "0", "--sim-answer-tokens", "40")
    answer = complete(sim, text_body()).json()
    assert answer["usage"]["completion_tokens"] == 16
    assert answer["choices"][0]["finish_reason"] == "length"


def test_a_batch_gets_one_choice_and_one_engine_sequence_per_prompt(sim):
    prompts = ["First invoice:", "Second invoice:", "Third invoice:"]
    answer = complete(sim, text_body(prompts, max_tokens=4)).json()
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    singles = [complete(sim, text_body(p, max_tokens=4)).json()["choices"][0]["text"] for p in prompts]
    assert [c["text"] for c in answer["choices"]] == singles  # each prompt's text is its own
    assert answer["usage"]["completion_tokens"] == 12
    assert metric(sim, "vllm:request_success_total", finished_reason="length") == 6  # a sequence each


def test_token_id_prompts_count_their_ids(sim):
    single = complete(sim, text_body([101, 2023, 2003, 102], max_tokens=2)).json()
    assert single["usage"]["prompt_tokens"] == 4 and len(single["choices"]) == 1
    batch = complete(sim, text_body([[1, 2, 3], [4, 5]], max_tokens=2)).json()
    assert batch["usage"]["prompt_tokens"] == 5 and len(batch["choices"]) == 2


def test_echo_puts_the_prompt_before_the_text(sim):
    plain = complete(sim, text_body(max_tokens=3, seed=1)).json()["choices"][0]["text"]
    echoed = complete(sim, text_body(max_tokens=3, seed=1, echo=True)).json()["choices"][0]["text"]
    assert echoed == "The invoice number is" + plain


def test_stream_sends_text_chunks_then_usage_when_asked(sim):
    r = complete(sim, text_body(max_tokens=6, stream=True, stream_options={"include_usage": True}), stream=True)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events = sse(r)
    assert events[-1] == "[DONE]"
    *chunks, usage_event, _ = events
    assert len(chunks) == 6 and all(e["object"] == "text_completion" for e in chunks)
    assert [e["choices"][0]["finish_reason"] for e in chunks] == [None] * 5 + ["length"]
    assert usage_event["choices"] == [] and usage_event["usage"]["completion_tokens"] == 6
    whole = complete(sim, text_body(max_tokens=6)).json()["choices"][0]["text"]
    assert "".join(e["choices"][0]["text"] for e in chunks) == whole
    plain = sse(complete(sim, text_body(max_tokens=6, stream=True), stream=True))
    assert not any(isinstance(e, dict) and "usage" in e for e in plain)


def test_batched_stream_tags_each_chunk_with_its_prompt(sim):
    events = sse(complete(sim, text_body(["a", "b"], max_tokens=3, stream=True), stream=True))
    chunks = events[:-1]
    assert sorted(e["choices"][0]["index"] for e in chunks) == [0, 0, 0, 1, 1, 1]
    finished = [e["choices"][0]["index"] for e in chunks if e["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1]


def test_bad_requests_are_answered_like_vllm(sim):
    missing = complete(sim, {"model": SERVED_MODEL})
    assert missing.status_code == 400
    assert "Either prompt or prompt_embeds must be provided" in missing.json()["error"]["message"]
    assert complete(sim, text_body(user=7)).json()["error"]["param"] == "body.user"
    suffix = complete(sim, text_body(suffix="."))
    assert (suffix.status_code, suffix.json()["error"]["message"]) == (400, "suffix is not currently supported")
    too_long = complete(sim, text_body("x" * 4 * 5000)).json()["error"]
    assert too_long["param"] == "prompt" and "maximum context length is 4096" in too_long["message"]
    unknown = complete(sim, text_body(model="gpt-4"))
    assert (unknown.status_code, unknown.json()["error"]["type"]) == (404, "NotFoundError")
    echo_ids = complete(sim, text_body([1, 2], echo=True))
    assert echo_ids.status_code == 400 and "send the prompt as text" in echo_ids.json()["error"]["message"]


def test_openai_sdk_reads_it(sim):
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="unused")
    completion = client.completions.create(model=SERVED_MODEL, prompt="Total:", max_tokens=3, user="10001")
    assert completion.choices[0].finish_reason == "length" and completion.usage.completion_tokens == 3
    stream = client.completions.create(model=SERVED_MODEL, prompt="Total:", max_tokens=3, stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream) == completion.choices[0].text
