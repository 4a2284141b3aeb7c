"""The request side of vLLM's OpenAI API (chat and text completions): validation, errors, prompt accounting.

Validation uses pydantic models shaped like vLLM's ChatCompletionRequest and CompletionRequest, so a wrong
type gets the same 400 vLLM (>= 0.10.1) sends: `{"error": {"message": "1 validation error:\\n  {...}",
"type": "Bad Request", "param": "body.user", "code": 400}}`.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
from http import HTTPStatus
from typing import Any, Optional, Union

from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, model_validator

# MiniCPM-V encodes an image as 448x448 slices (at most 9, plus an overview) of 64 tokens each.
SLICE_PIXELS = 448 * 448
TOKENS_PER_SLICE = 64
MAX_SLICES = 9
TOKENS_PER_MESSAGE = 4  # chat template markers around each message
GENERATION_PROMPT_TOKENS = 3


class APIError(Exception):
    """An error answered in vLLM's envelope; `http_status` when the HTTP status differs from the envelope's code."""

    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None, http_status: int | None = None):
        super().__init__(message)
        self.message, self.status, self.err_type, self.param = message, status, err_type, param
        self.http_status = http_status or status

    def body(self) -> dict:
        return error_body(self.message, self.err_type, self.status, self.param)


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: Optional[bool] = True
    continuous_usage_stats: Optional[bool] = False


class _Request(BaseModel):
    """What vLLM's chat and text completion requests share. Each declares its fields in vLLM's order, which is
    the order of validation errors (the first names `param`); fields the simulator does not act on are
    accepted."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def stream_options_need_stream(cls, data):
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return data

    @property
    def ignored_fields(self) -> list[str]:
        return sorted(self.model_extra or {})

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options is not None and self.stream_options.include_usage)


class ChatCompletionRequest(_Request):
    """vLLM's ChatCompletionRequest (/v1/chat/completions)."""

    messages: list[dict[str, Any]]
    model: Optional[str] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    seed: Optional[int] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = None
    user: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None

    @property
    def thinking(self) -> bool:
        """Only chat_template_kwargs switches thinking off; a top-level enable_thinking is ignored."""
        return (self.chat_template_kwargs or {}).get("enable_thinking", True) is not False


class CompletionRequest(_Request):
    """vLLM's CompletionRequest (/v1/completions): a raw prompt, no chat template, so no thinking block."""

    model: Optional[str] = None
    # A list of ints is one tokenised prompt; a list of lists or of strings is a batch.
    prompt: Optional[Union[list[int], list[list[int]], str, list[str]]] = None
    echo: Optional[bool] = False
    max_tokens: Optional[int] = 16  # vLLM's default for text completions
    seed: Optional[int] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    suffix: Optional[str] = None
    temperature: Optional[float] = None
    user: Optional[str] = None

    @model_validator(mode="before")
    @classmethod
    def prompt_required(cls, data):
        if isinstance(data, dict) and data.get("prompt") in (None, "", []):
            raise ValueError("Either prompt or prompt_embeds must be provided and non-empty.")
        return data

    @property
    def prompts(self) -> list[str | list[int]]:
        """The batch: each entry is a text or a list of token ids, and gets its own choice."""
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)


def validation_error(errors: list[dict]) -> APIError:
    """Format pydantic errors the way vLLM's RequestValidationError handler does."""
    errors = [{**e, "loc": ("body", *e["loc"])} for e in errors]
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "".join(f"  {e}\n" for e in errors)
    param = ".".join(str(part) for part in errors[0]["loc"]) if errors else None
    return APIError(message.rstrip(), HTTPStatus.BAD_REQUEST, HTTPStatus.BAD_REQUEST.phrase, param)


def parse_request(raw: bytes, model: type[BaseModel] | TypeAdapter = ChatCompletionRequest):
    """Validate a JSON body against a request model (or a TypeAdapter of a union of them, as FastAPI does)."""
    if not raw.strip():
        raise validation_error([{"type": "missing", "loc": (), "msg": "Field required", "input": None}])
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        pos, why = (e.pos, e.msg) if isinstance(e, json.JSONDecodeError) else (e.start, e.reason)
        raise validation_error([{"type": "json_invalid", "loc": (pos,), "msg": "JSON decode error",
                                 "input": {}, "ctx": {"error": why}}]) from None
    try:
        return model.validate_python(data) if isinstance(model, TypeAdapter) else model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e.errors(include_url=False)) from None


def check_sampling(request: ChatCompletionRequest | CompletionRequest) -> int | None:
    """The requested completion budget (vLLM's SamplingParams checks)."""
    max_tokens = getattr(request, "max_completion_tokens", None) or request.max_tokens
    if max_tokens is not None and max_tokens < 1:
        raise APIError(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
    if request.temperature is not None and request.temperature < 0:
        raise APIError(f"temperature must be non-negative, got {request.temperature}.", param="temperature")
    return max_tokens


def text_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / 4)


def image_tokens(width: int, height: int) -> int:
    slices = min(MAX_SLICES, max(1, math.ceil(width * height / SLICE_PIXELS)))
    return TOKENS_PER_SLICE * (slices + (1 if slices > 1 else 0))


def _decode_image(url: str, number: int) -> tuple[int, int]:
    """Decode a data: URI and read the image header (Pillow reads no pixel data here)."""
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0] if ":" in url else "relative"
        raise APIError(f"image {number}: the server is offline and cannot fetch {scheme} URLs; "
                       "send the image inline as a data:image/...;base64,... URI")
    spec, sep, payload = url[5:].partition(",")
    if not sep or not spec.endswith(";base64"):
        raise APIError(f"image {number}: only base64 data URLs are supported "
                       "(data:image/png;base64,...)")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise APIError(f"image {number}: invalid base64 data ({e}); encode the file bytes with "
                       "standard base64") from None
    try:
        with Image.open(io.BytesIO(raw)) as image:
            return image.size
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise APIError(f"image {number}: cannot identify image file ({len(raw)} bytes decoded: {e}); "
                       "send PNG, JPEG, WebP, GIF or BMP bytes") from None


def _image_url(part: dict) -> str:
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str):
        raise APIError('an image_url part needs {"image_url": {"url": "data:image/...;base64,..."}}',
                       param="messages")
    return url


def count_prompt(messages: list[dict], image_limit: int) -> tuple[int, int]:
    """Prompt tokens and number of images, checking images the way vLLM's media loader does."""
    tokens = GENERATION_PROMPT_TOKENS
    urls = []
    for message in messages:
        tokens += TOKENS_PER_MESSAGE
        content = message.get("content")
        if isinstance(content, str):
            tokens += text_tokens(content)
        elif isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    tokens += text_tokens(str(part.get("text", "")))
                elif kind == "image_url":
                    urls.append(_image_url(part))
                else:
                    raise APIError(f"Unknown part type: {kind!r}; the model takes 'text' and 'image_url' parts",
                                   param="messages")
        elif content is not None:
            raise APIError("message content must be a string or a list of parts", param="messages")
    if len(urls) > image_limit:
        raise APIError(f"At most {image_limit} image(s) may be provided in one prompt.", param="messages")
    for number, url in enumerate(urls, 1):
        tokens += image_tokens(*_decode_image(url, number))
    return tokens, len(urls)


def check_length(prompt_tokens: int, max_tokens: int | None, max_model_len: int, param: str = "messages") -> int:
    """vLLM's context check; returns the completion budget."""
    if prompt_tokens >= max_model_len:
        raise APIError(f"This model's maximum context length is {max_model_len} tokens. However, your "
                       f"request has {prompt_tokens} input tokens. Please reduce the length of the input "
                       f"{param}.", param=param)
    if max_tokens is None:
        return max_model_len - prompt_tokens
    if prompt_tokens + max_tokens > max_model_len:
        raise APIError(f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                       f"maximum context length is {max_model_len} tokens and your request has "
                       f"{prompt_tokens} input tokens ({max_tokens} > {max_model_len} - {prompt_tokens}).",
                       param="max_tokens")
    return max_tokens
