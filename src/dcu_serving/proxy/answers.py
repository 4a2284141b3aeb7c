"""What the results log learns from a backend's answer: finish_reason, token counts, the error message.

Pure functions of the bytes the backend sent: they return the record's fields they found and leave the
recording to the relay, so each case is tested directly, without a process or a socket. On a stream they
also drop the usage event vLLM sends when the proxy asked for it and the caller did not.
"""

from __future__ import annotations

import ast
import re

from . import fastjson


def has_value(text: bytes, key: bytes) -> bool:
    """True if `key` (e.g. b'"usage":') occurs in the JSON text with a value other than null.

    A byte search, so the chunks that carry none of the keys (most of a stream) are not parsed.
    """
    i = text.find(key)
    while i >= 0:
        j = i + len(key)
        while text[j:j + 1] == b" ":
            j += 1
        if text[j:j + 1] != b"n":
            return True
        i = text.find(key, j)
    return False


def error_message(answer: dict):
    """The message of an error answer: vLLM's envelope, or the bare `message`/`error` others send; without
    the request's own values when it quotes them (see `without_inputs`)."""
    error = answer.get("error")
    if isinstance(error, dict):
        message = error.get("message")
    else:
        message = answer.get("message") or (error if isinstance(error, str) else None)
    if isinstance(message, str) and _VALIDATION.match(message):
        return without_inputs(message)
    return message


_VALIDATION = re.compile(r"\d+ validation errors?:?\n")
_LOC_MSG = re.compile(r"'loc': \(([^)]*)\), 'msg': '([^']*)'")


def without_inputs(message: str) -> str:
    """A validation error without the values it quotes.

    vLLM (FastAPI) answers a request that fails validation with `str(RequestValidationError)`: a line per
    error, each the repr of pydantic's error dict, whose `input` is the offending value — for a union of
    request types (embeddings: a text or a chat form) the whole request, prompts and documents included. The
    results log keeps where and why (`body.user: Input should be a valid string`), never the input.
    """
    head, _, rest = message.partition("\n")
    parts = []
    for line in rest.splitlines():
        try:
            error = ast.literal_eval(line.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):  # e.g. an exception object in `ctx`
            found = _LOC_MSG.search(line)
            error = {"loc": [p.strip(" '\"") for p in found[1].split(",") if p.strip()], "msg": found[2]} \
                if found else None
        if isinstance(error, dict):
            loc = ".".join(str(part) for part in error.get("loc", ()))
            parts.append(f"{loc}: {error.get('msg', '')}" if loc else str(error.get("msg", "")))
    return f"{head} {'; '.join(parts)}" if parts else head


def usage_fields(usage) -> dict:
    """prompt_tokens and completion_tokens of a stream's `usage` object; nothing if it is not one."""
    if isinstance(usage, dict):
        return {"prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens")}
    return {}


ANSWER_FIELDS = ("finish_reason", "prompt_tokens", "completion_tokens", "error")


def answer_fields(body: bytes, status: int) -> tuple:
    """The record's ANSWER_FIELDS for a whole (not streamed) answer: finish_reason and token counts of a
    200, the error message of anything else (its first 300 bytes if it is not JSON); None where absent.

    A tuple, not a dict: this runs for every answer that is not a stream, and building a dict and merging
    it into the record costs about 1,500 instructions more (0.4% of a request, counted with callgrind).
    """
    try:
        answer = fastjson.loads(body)
    except ValueError:
        error = None if status == 200 else body[:300].decode("utf-8", "replace")
        return None, None, None, error
    if not isinstance(answer, dict):
        return None, None, None, None
    if status != 200:
        return None, None, None, error_message(answer)
    choices = answer.get("choices")
    finish_reason = None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        finish_reason = choices[0].get("finish_reason")
    usage = answer.get("usage")
    if isinstance(usage, dict):
        prompt_tokens = usage.get("prompt_tokens")
        if prompt_tokens is None:  # rerank counts only total_tokens: every one a prompt token
            prompt_tokens = usage.get("total_tokens")
        return finish_reason, prompt_tokens, usage.get("completion_tokens"), None
    if "error" in answer:  # vLLM answers an API its model does not serve with a 200 and its error (vllm#21704)
        return finish_reason, None, None, error_message(answer)
    return finish_reason, None, None, None


def scan_events(block: bytes, strip_usage: bool) -> tuple[bytes, dict]:
    """(what to pass on, the fields found) for a block of complete SSE events.

    The fields are finish_reason, token counts and error, the last event's value winning. With
    `strip_usage` the usage-only event (empty `choices`) is dropped: the caller did not ask for it. Most
    blocks carry none of these and pass through as they are, unparsed.
    """
    if not (has_value(block, b'"finish_reason":') or has_value(block, b'"usage":') or b'"error"' in block):
        return block, {}
    fields: dict = {}
    kept = []
    for event in block.split(b"\n\n"):
        if not event:
            continue
        start = event.find(b"{")
        if start >= 0 and (b'"finish_reason"' in event or b'"usage"' in event or b'"error"' in event):
            try:
                obj = fastjson.loads(event[start:])
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                choices = obj.get("choices")
                if isinstance(choices, list):
                    for choice in choices:
                        if isinstance(choice, dict) and choice.get("finish_reason"):
                            fields["finish_reason"] = choice["finish_reason"]
                usage = obj.get("usage")
                fields.update(usage_fields(usage))
                if "error" in obj and isinstance(obj["error"], (dict, str)):
                    fields["error"] = error_message(obj)
                if strip_usage and usage and choices == []:
                    continue
        kept.append(event)
        kept.append(b"\n\n")
    return b"".join(kept), fields
