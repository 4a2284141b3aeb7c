"""The service contract, checked on the request before it costs a card anything.

It applies to the chat and completions APIs (chat and vision models); embeddings, rerank, score and
transcription requests pass on as they came. The JSON body is parsed once, by orjson (a fifth of the
standard library's time). When nothing had to change, the caller's original bytes are forwarded; the only
routine change (asking vLLM for usage on a stream) is spliced into the bytes, not re-serialised. Every rule
can be relaxed in the config (contract.*); every message tells the caller what to change.
"""

from __future__ import annotations

import json

import orjson

from . import fastjson
from .config import Contract
from .errors import ProxyError

_WHITESPACE = b" \t\r\n"
_USAGE_OPTION = b'"stream_options":{"include_usage":true},'


class Call:
    """What the proxy learned about one request: for routing, stream handling and the results log."""

    __slots__ = ("body", "model", "orid", "stream", "strip_usage")

    def __init__(self, body: bytes, model, orid, stream: bool, strip_usage: bool):
        self.body = body
        self.model = model
        self.orid = orid
        self.stream = stream
        self.strip_usage = strip_usage


def parse(body: bytes) -> dict:
    """The request as a dict. The standard library reads what orjson refuses (so callers see its error
    messages) and any request whose `user` orjson read as a float: orjson reads an integer beyond 64 bits,
    such as a long numeric orid, as a float."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        payload = None
    if isinstance(payload, dict) and not isinstance(payload.get("user"), float):
        return payload
    return parse_exact(body)


def parse_exact(body: bytes) -> dict:
    """The request as the standard library reads it: every integer exact."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProxyError(400, f"The request body is not valid JSON ({e}). Send a JSON object with "
                              f"Content-Type: application/json.") from None
    except RecursionError:
        raise ProxyError(400, "The request body nests JSON arrays or objects too deeply to read; send a "
                              "flatter JSON object.") from None
    if not isinstance(payload, dict):
        raise ProxyError(400, f"The request body must be a JSON object, got a JSON {type(payload).__name__}.")
    return payload


def check(body: bytes, payload: dict, rules: Contract, exact: bool = False) -> Call:
    """Apply the contract to one parsed chat or completions request; raise ProxyError(400) or return the Call
    to forward. Its `model` was routed already (routing.py): the contract is what a chat model needs.

    `exact`: the payload came from parse_exact. A request that must be re-serialised is checked again on
    the exact parse, so no integer elsewhere in it (a seed, say) can come out as a float.
    """
    changed = False
    model = payload.get("model")
    user = payload.get("user")
    if user is not None and not isinstance(user, str):
        if rules.user == "reject":
            raise ProxyError(400, f"`user` must be a string, got {type(user).__name__} {json.dumps(user)}: send "
                                  f"the orid as text, \"user\": str(orid), e.g. \"{user}\".", "user")
        user = payload["user"] = str(user)
        changed = True

    if "enable_thinking" in payload:
        if rules.enable_thinking == "reject":
            raise ProxyError(400, "`enable_thinking` at the top level is ignored by vLLM (thinking stays on and "
                                  "costs tokens): move it into chat_template_kwargs, e.g. "
                                  "\"chat_template_kwargs\": {\"enable_thinking\": false}.", "enable_thinking")
        value = payload.pop("enable_thinking")
        kwargs = payload.get("chat_template_kwargs")
        if kwargs is None:
            kwargs = payload["chat_template_kwargs"] = {}
        if isinstance(kwargs, dict):
            kwargs.setdefault("enable_thinking", value)
        changed = True

    messages = payload.get("messages")
    if isinstance(messages, list) and (rules.image_urls == "reject" or rules.max_images):
        _check_images(messages, rules)

    stream = payload.get("stream") is True
    strip_usage = False
    if stream:
        options = payload.get("stream_options")
        if options is None or (isinstance(options, dict) and options.get("include_usage") is not True):
            # vLLM reports usage on a stream only when asked; ask, and strip it again for the caller.
            strip_usage = True
            spliced = _splice_usage_option(body) if options is None and not changed else None
            if spliced is not None:
                body = spliced
            else:
                payload["stream_options"] = {**(options or {}), "include_usage": True}
                changed = True
    if changed:
        if not exact:
            return check(body, parse_exact(body), rules, exact=True)
        body = fastjson.dumps(payload)
    return Call(body, model, user, stream, strip_usage)


def _splice_usage_option(body: bytes) -> bytes | None:
    """Insert stream_options as the object's first member; None if the bytes are not plain UTF-8 JSON."""
    start = len(body) - len(body.lstrip(_WHITESPACE))
    if body[start:start + 1] != b"{":
        return None
    return body[:start + 1] + _USAGE_OPTION + body[start + 1:]


def _check_images(messages: list, rules: Contract):
    count = 0
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, dict) or "image_url" not in part:
                continue
            count += 1
            if rules.image_urls == "reject":
                image = part["image_url"]
                url = image.get("url") if isinstance(image, dict) else image
                if isinstance(url, str) and url[:8].lower().startswith(("http://", "https://")):
                    shown = url if len(url) <= 80 else url[:77] + "..."
                    raise ProxyError(
                        400, f"messages[{i}].content[{j}]: the image URL {shown} cannot be fetched, the serving "
                             f"cluster is offline. Send the image inline as a data URI "
                             f"(data:image/jpeg;base64,...).", f"messages[{i}].content[{j}].image_url")
    if rules.max_images and count > rules.max_images:
        raise ProxyError(400, f"The request carries {count} images; at most {rules.max_images} are allowed per "
                              f"request. Send fewer images or split them over several requests.", "messages")
