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
        _check_media(messages, rules)

    stream = payload.get("stream")
    stream = stream is True or (stream is not None and stream is not False and lax_bool(stream))
    strip_usage = False
    if stream:
        options = payload.get("stream_options")
        asked = isinstance(options, dict) and lax_bool(options.get("include_usage"))
        if not asked and (options is None or isinstance(options, dict)):  # anything else is vLLM's 400
            # vLLM reports usage on a stream only when asked; ask, and strip it again for the caller. Whatever the
            # caller sent (nothing, null, false, continuous stats), vLLM reads what is written here.
            strip_usage = True
            spliced = _splice_usage_option(body) if "stream_options" not in payload and not changed else None
            if spliced is not None:
                body = spliced
            else:
                kept = options if isinstance(options, dict) else {}
                # continuous_usage_stats without include_usage sends nothing; with it, usage on every chunk
                payload["stream_options"] = {**kept, "include_usage": True, "continuous_usage_stats": False}
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


# pydantic's lax booleans, as vLLM reads `stream` and `include_usage`: anything else is vLLM's 400.
_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
# Parts that name media by URL, as vLLM reads them: {"image_url": {"url": ...}} or {"image_url": "..."}
# (also the Responses API's input_image), audio_url, video_url.
_MEDIA_URLS = ("image_url", "video_url", "audio_url")
# What urllib (and so vLLM's media fetcher) strips from a URL before reading its scheme.
_URL_STRIP = "".join(chr(c) for c in range(33))
_URL_DROP = str.maketrans("", "", "\t\r\n")


def lax_bool(value) -> bool:
    """True where vLLM (pydantic, lax mode) reads `value` as true."""
    if value is True or value is False or value is None:
        return value is True
    if isinstance(value, (int, float)):
        return value == 1
    return isinstance(value, str) and value.strip().lower() in _TRUE


def inline(url: str) -> bool:
    """Whether a media URL is inline data once normalised as vLLM's fetcher reads it (a leading space, a tab
    inside, an upper-case scheme): only `data:` URLs are; http(s), file, ftp and the rest would be fetched."""
    return url.translate(_URL_DROP).lstrip(_URL_STRIP)[:5].lower() == "data:"


def _check_media(messages: list, rules: Contract):
    """Every media part of every message: only inline data while the cluster is offline (image_urls: reject),
    and at most max_images images."""
    count = 0
    reject = rules.image_urls == "reject"
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            if "image_url" in part:
                count += 1
            if reject:
                _check_part(part, f"messages[{i}].content[{j}]")
    if rules.max_images and count > rules.max_images:
        raise ProxyError(400, f"The request carries {count} images; at most {rules.max_images} are allowed per "
                              f"request. Send fewer images or split them over several requests.", "messages")


def _check_part(part: dict, where: str):
    for key in _MEDIA_URLS:
        media = part.get(key)
        if media is None:
            continue
        url = media.get("url") if isinstance(media, dict) else media
        if isinstance(url, str) and not inline(url):
            shown = url.strip()
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            kind = key.split("_")[0]
            raise ProxyError(400, f"{where}: the {kind} URL {shown!r} cannot be fetched, the serving cluster is "
                                  f"offline. Send the {kind} inline as a data URI (data:{_MIME[kind]};base64,...).",
                             f"{where}.{key}")
    file = part.get("file")
    if isinstance(file, dict) and any(k != "filename" and k != "file_data" for k in file):
        raise ProxyError(400, f"{where}: a file part may only carry its data inline (file_data), the serving "
                              f"cluster is offline and has no uploaded files: send file_data with the file's "
                              f"content.", f"{where}.file")


_MIME = {"image": "image/jpeg", "video": "video/mp4", "audio": "audio/wav"}
