"""What the results log takes from the backends' answers, and the usage event a caller did not ask for.

Plain function calls on the bytes vLLM sends: no process, no socket.
"""

from __future__ import annotations

import json

import pytest

from dcu_serving.proxy.answers import ANSWER_FIELDS, answer_fields, error_message, has_value, scan_events


def note(body: bytes, status: int = 200) -> dict:
    """The record's answer fields after the relay has noted a whole answer."""
    return dict(zip(ANSWER_FIELDS, answer_fields(body, status), strict=True))


def event(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chunk(content: str | None = None, finish_reason: str | None = None) -> dict:
    """A chat.completion.chunk as vLLM streams it."""
    delta = {} if content is None else {"content": content}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}


USAGE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
         "usage": {"prompt_tokens": 13, "total_tokens": 19, "completion_tokens": 6}}
DONE = b"data: [DONE]\n\n"


# -- whole answers --

def test_answer_fields_come_from_the_first_choice_and_the_usage():
    answer = {"choices": [{"message": {"content": 'the text says "finish_reason": "evil", "usage": {}'},
                           "finish_reason": "length"},
                          {"message": {"content": "second"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 13, "completion_tokens": 6, "total_tokens": 19}}
    for text in (json.dumps(answer), json.dumps(answer, separators=(",", ":")), json.dumps(answer, indent=2)):
        assert note(text.encode()) == {"finish_reason": "length", "prompt_tokens": 13, "completion_tokens": 6,
                                       "error": None}


def test_answers_without_the_fields_leave_them_empty():
    assert note(b"<html>busy</html>")["finish_reason"] is None
    assert note(b'{"choices": [], "usage": null}') == {"finish_reason": None, "prompt_tokens": None,
                                                      "completion_tokens": None, "error": None}
    assert note(b'{"error": {"message": "no such model"}}', 404)["error"] == "no such model"
    assert note(b"upstream exploded", 500)["error"] == "upstream exploded"


def test_a_failed_answer_records_its_message_not_its_counts():
    failed = {"error": {"message": "max_tokens is too large", "code": 400}, "usage": {"prompt_tokens": 5}}
    assert note(json.dumps(failed).encode(), 400) == {"finish_reason": None, "prompt_tokens": None,
                                                      "completion_tokens": None, "error": "max_tokens is too large"}
    assert note(b"x" * 1000, 502)["error"] == "x" * 300  # not JSON: its start, cut at 300 bytes


@pytest.mark.parametrize(("answer", "message"), [
    ({"error": {"message": "vLLM's envelope", "type": "BadRequestError"}}, "vLLM's envelope"),
    ({"object": "error", "message": "a bare message"}, "a bare message"),
    ({"error": "a bare string"}, "a bare string"),
    ({"detail": "something else"}, None),
])
def test_error_messages_in_the_shapes_servers_send(answer, message):
    assert error_message(answer) == message


# -- streams --

def test_ordinary_chunks_pass_through_unparsed():
    block = event(chunk("Hel")) + event(chunk("lo"))  # "finish_reason":null, no usage
    passed, fields = scan_events(block, strip_usage=True)
    assert passed is block and fields == {}


def test_the_last_chunk_gives_the_finish_reason_and_passes_unchanged():
    block = event(chunk("!")) + event(chunk(finish_reason="stop")) + DONE
    passed, fields = scan_events(block, strip_usage=False)
    assert passed == block
    assert fields == {"finish_reason": "stop"}


def test_the_usage_event_the_caller_did_not_ask_for_is_dropped_but_counted():
    block = event(chunk(finish_reason="length")) + event(USAGE) + DONE
    passed, fields = scan_events(block, strip_usage=True)
    assert passed == event(chunk(finish_reason="length")) + DONE
    assert fields == {"finish_reason": "length", "prompt_tokens": 13, "completion_tokens": 6}


def test_the_usage_event_the_caller_asked_for_is_passed_on():
    block = event(USAGE) + DONE
    passed, fields = scan_events(block, strip_usage=False)
    assert passed == block
    assert fields == {"prompt_tokens": 13, "completion_tokens": 6}


def test_usage_on_a_chunk_with_choices_is_never_dropped():
    with_choices = {**chunk(finish_reason="stop"), "usage": USAGE["usage"]}  # continuous_usage_stats
    block = event(with_choices)
    passed, fields = scan_events(block, strip_usage=True)
    assert passed == block and fields["completion_tokens"] == 6


def test_an_error_event_is_recorded_and_passed_on():
    block = event({"error": {"message": "engine dead", "type": "InternalServerError", "code": 500}}) + DONE
    passed, fields = scan_events(block, strip_usage=True)
    assert passed == block
    assert fields == {"error": "engine dead"}


def test_of_several_events_the_last_value_wins():
    block = event(chunk(finish_reason="length")) + event(chunk(finish_reason="stop"))
    assert scan_events(block, strip_usage=False)[1] == {"finish_reason": "stop"}


def test_an_event_that_is_not_json_passes_on_as_it_came():
    block = b'data: {"finish_reason": "stop", broken\n\n' + DONE
    passed, fields = scan_events(block, strip_usage=True)
    assert passed == block and fields == {}


def test_the_text_of_an_answer_is_not_mistaken_for_its_fields():
    # A model that writes JSON: the keys arrive escaped inside the content string.
    block = event(chunk('{"finish_reason": "stop", "usage": {"prompt_tokens": 1}, "error": "x"}'))
    passed, fields = scan_events(block, strip_usage=True)
    assert passed == block and fields == {}


@pytest.mark.parametrize(("text", "found"), [
    (b'{"usage": null}', False),
    (b'{"usage":null}', False),
    (b'{"usage":   null}', False),
    (b'{"usage": {"prompt_tokens": 1}}', True),
    (b'{"usage": null, "x": 1}\n\n{"usage": {}}', True),  # the second occurrence has a value
    (b'{"other": 1}', False),
])
def test_has_value_tells_null_from_a_value(text, found):
    assert has_value(text, b'"usage":') is found


# -- the pooling and speech APIs, and errors that quote the request --

def test_pooling_answers_count_their_prompt_tokens():
    embeddings = {"object": "list", "data": [{"index": 0, "object": "embedding", "embedding": [0.1]}],
                  "usage": {"prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0}}
    assert note(json.dumps(embeddings).encode()) == {"finish_reason": None, "prompt_tokens": 7,
                                                     "completion_tokens": 0, "error": None}
    rerank = {"id": "rerank-1", "model": "r", "usage": {"total_tokens": 31}, "results": []}  # no prompt_tokens
    assert note(json.dumps(rerank).encode())["prompt_tokens"] == 31
    assert note(b'{"text": "Hello there."}') == dict.fromkeys(ANSWER_FIELDS)  # a transcription: text only


def test_an_api_the_model_does_not_serve_is_a_200_with_an_error_and_recorded_as_one():
    # vLLM 0.11 returns its ErrorResponse without a status: HTTP 200 (vllm-project/vllm#21704).
    body = {"error": {"message": "The model does not support Embeddings API", "type": "BadRequestError",
                      "param": None, "code": 400}}
    assert note(json.dumps(body).encode())["error"] == "The model does not support Embeddings API"


def test_a_validation_error_is_recorded_without_the_values_it_quotes():
    secret = "CONFIDENTIAL contract text"
    errors = [{"type": "string_type", "loc": ("body", "EmbeddingCompletionRequest", "user"),
               "msg": "Input should be a valid string", "input": 123},
              {"type": "missing", "loc": ("body", "EmbeddingChatRequest", "messages"), "msg": "Field required",
               "input": {"input": [secret], "user": 123}}]
    message = "2 validation errors:\n" + "".join(f"  {e}\n" for e in errors)  # FastAPI's str(), as vLLM sends it
    body = {"error": {"message": message, "type": "Bad Request", "param": "body.user", "code": 400}}
    recorded = note(json.dumps(body).encode(), 400)["error"]
    assert recorded == ("2 validation errors: body.EmbeddingCompletionRequest.user: Input should be a valid "
                        "string; body.EmbeddingChatRequest.messages: Field required")
    odd = "1 validation error:\n  {'type': 'value_error', 'loc': ('body', 'input'), 'msg': 'Value error, bad', " \
          f"'input': '{secret}', 'ctx': {{'error': ValueError('bad')}}}}\n"  # not a literal: read by pattern
    assert error_message({"error": {"message": odd}}) == "1 validation error: body.input: Value error, bad"
    assert secret not in error_message({"error": {"message": "1 validation error:\n  garbage " + secret}})
