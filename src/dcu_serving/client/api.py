"""recognize / recognize_stream / check_service: the service contract as a function call."""

from __future__ import annotations

import json
import logging
import os
import random
import time
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Iterator, Sequence

import requests

from .errors import (
    BackendError,
    ServiceError,
    ServiceTimeout,
    ServiceUnavailable,
    TruncatedError,
    error_from_response,
)
from .images import DEFAULT_MAX_ASPECT, MAX_IMAGES, ImageInput, to_data_uri
from .thinking import ThinkingSplitter, split_thinking

log = logging.getLogger("dcu_serving.client")

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_MODEL = "MiniCPM-V-4.5"
DEFAULT_PROMPT = "请详细描述这张图片的内容。"
DEFAULT_TIMEOUT = 180.0
MIN_SAFE_TIMEOUT = 120.0  # thinking output plus queueing routinely takes tens of seconds
_warned_short_timeout = False


@dataclass
class Result(Mapping):
    """One answer. Read its fields as attributes (r.answer) or, read-only, as keys (r["answer"]): the design
    document's standard client returned a dict, and code written against it runs unchanged."""

    answer: str
    thinking: str
    finish_reason: str | None
    backend: str | None
    request_id: str | None
    orid: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    attempts: int = 1

    @property
    def truncated(self) -> bool:
        """True when the answer hit max_tokens: do not store it as if it were complete."""
        return self.finish_reason == "length"

    def to_dict(self) -> dict:
        return {**asdict(self), "truncated": self.truncated}

    # -- read-only item access: r["answer"], r.get("backend"), dict(r), "thinking" in r --
    def __getitem__(self, key):
        if key in RESULT_KEYS:
            return getattr(self, key)
        raise KeyError(f"Result has no key {key!r}; its keys are {', '.join(RESULT_KEYS)}")

    def __iter__(self) -> Iterator[str]:
        return iter(RESULT_KEYS)

    def __len__(self) -> int:
        return len(RESULT_KEYS)

    def __setitem__(self, key, value):
        raise TypeError(f"Result is read-only: r[{key!r}] cannot be assigned; dict(r) is a copy you can change")

    def __delitem__(self, key):
        raise TypeError(f"Result is read-only: r[{key!r}] cannot be deleted; dict(r) is a copy you can change")


RESULT_KEYS = (*(f.name for f in fields(Result)), "truncated")


@dataclass
class Retry:
    """Bounded retries with jittered exponential backoff, for retryable errors only."""

    attempts: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 10.0

    def delay(self, attempt: int, error: ServiceError) -> float:
        if error.retry_after is not None:
            return min(error.retry_after, self.max_backoff_s)
        base = min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)
        return random.uniform(base / 2, base)


def _base_url(base_url: str | None) -> str:
    return (base_url or os.environ.get("DCU_SERVING_URL") or DEFAULT_URL).rstrip("/")


def _check_timeout(timeout: float) -> float:
    global _warned_short_timeout
    if timeout < MIN_SAFE_TIMEOUT and not _warned_short_timeout:
        _warned_short_timeout = True
        warnings.warn(
            f"timeout={timeout}s is shorter than the {MIN_SAFE_TIMEOUT:.0f}s the service contract asks for: "
            "answers with thinking routinely take tens of seconds and the client would cut them off",
            stacklevel=3,
        )
    return timeout


def build_request(images: ImageInput | Sequence[ImageInput], prompt: str, orid: str, *, model: str,
                  max_tokens: int, temperature: float, enable_thinking: bool, stream: bool,
                  max_aspect: float | None) -> dict:
    """The request body the contract wants: data URIs, user=str(orid), thinking in chat_template_kwargs."""
    if isinstance(images, (str, bytes, bytearray, os.PathLike)):
        images = [images]
    images = list(images)
    if not 1 <= len(images) <= MAX_IMAGES:
        raise ValueError(f"send 1 to {MAX_IMAGES} images per request, not {len(images)}")
    content = [{"type": "image_url", "image_url": {"url": to_data_uri(i, max_aspect)}} for i in images]
    content.append({"type": "text", "text": prompt})
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": int(max_tokens),
        "temperature": float(temperature),
        "stream": stream,
        "user": str(orid),
        "chat_template_kwargs": {"enable_thinking": bool(enable_thinking)},
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


class Client:
    """A connection to the service; the module-level functions use a shared default one."""

    def __init__(self, base_url: str | None = None, *, model: str = DEFAULT_MODEL,
                 timeout: float = DEFAULT_TIMEOUT, retry: Retry | None = None,
                 max_aspect: float | None = DEFAULT_MAX_ASPECT, session: requests.Session | None = None):
        self.base_url = _base_url(base_url)
        self.model = model
        self.timeout = _check_timeout(timeout)
        self.retry = retry or Retry()
        self.max_aspect = max_aspect
        self.session = session or requests.Session()

    # -- plumbing -------------------------------------------------------------------------------
    def _post(self, body: dict, stream: bool) -> tuple[requests.Response, int]:
        """POST with bounded retries of what is safe to retry; returns the response and attempts."""
        data = json.dumps(body, ensure_ascii=False).encode()
        url = f"{self.base_url}/v1/chat/completions"
        # The orid also as a header: a request dcu-proxy refuses before reading its body is still logged under it.
        headers = {"Content-Type": "application/json", "X-Orid": body["user"]}
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = self.session.post(url, data=data, stream=stream, timeout=self.timeout, headers=headers)
            except requests.Timeout as e:
                raise ServiceTimeout(
                    f"no answer within the client timeout of {self.timeout}s: lower max_tokens, "
                    "disable thinking or raise the timeout") from e
            except requests.ConnectionError as e:
                error: ServiceError = ServiceUnavailable(f"cannot reach {self.base_url}: {e}")
            else:
                if resp.status_code == 200:
                    return resp, attempt
                error = error_from_response(resp.status_code, resp.content, resp.headers)
                resp.close()
            if not error.retryable or attempt >= self.retry.attempts:
                raise error
            delay = self.retry.delay(attempt, error)
            log.warning("attempt %d failed (%s); retrying in %.2fs", attempt, error, delay)
            time.sleep(delay)  # backoff between attempts is the behaviour, not synchronisation

    def _body(self, image, prompt, orid, max_tokens, temperature, enable_thinking, stream):
        orid = str(orid) if orid is not None else f"auto-{uuid.uuid4().hex[:12]}"
        return orid, build_request(image, prompt, orid, model=self.model, max_tokens=max_tokens,
                                   temperature=temperature, enable_thinking=enable_thinking,
                                   stream=stream, max_aspect=self.max_aspect)

    # -- the API --------------------------------------------------------------------------------
    def recognize(self, image: ImageInput | Sequence[ImageInput], prompt: str = DEFAULT_PROMPT, *,
                  orid=None, max_tokens: int = 1024, temperature: float = 0.3,
                  enable_thinking: bool = True, strict: bool = False) -> Result:
        orid, body = self._body(image, prompt, orid, max_tokens, temperature, enable_thinking, False)
        started = time.monotonic()
        resp, attempts = self._post(body, stream=False)
        try:
            payload = resp.json()
        except ValueError as e:
            raise ServiceError(f"the service answered 200 with a body that is not JSON: {e}",
                               status=200, request_id=resp.headers.get("X-Request-Id")) from e
        choice = (payload.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        content = message.get("content") or ""
        thinking, answer = split_thinking(content)
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        if reasoning:  # a reasoning parser already split it out
            thinking = reasoning.strip()
        usage = payload.get("usage") or {}
        result = Result(
            answer=answer, thinking=thinking, finish_reason=choice.get("finish_reason"),
            backend=resp.headers.get("X-Backend"), request_id=resp.headers.get("X-Request-Id"),
            orid=orid, prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            latency_s=round(time.monotonic() - started, 4), attempts=attempts,
        )
        return _check_truncation(result, strict, max_tokens)

    def recognize_stream(self, image: ImageInput | Sequence[ImageInput], prompt: str = DEFAULT_PROMPT, *,
                         orid=None, max_tokens: int = 1024, temperature: float = 0.3,
                         enable_thinking: bool = True, show_thinking: bool = False,
                         strict: bool = False) -> Stream:
        orid, body = self._body(image, prompt, orid, max_tokens, temperature, enable_thinking, True)
        return Stream(self, body, orid, enable_thinking, show_thinking, strict, max_tokens)

    def lb_status(self) -> dict:
        try:
            resp = self.session.get(f"{self.base_url}/__lb_status", timeout=min(self.timeout, 10))
        except requests.RequestException as e:
            raise ServiceUnavailable(f"cannot reach {self.base_url}: {e}") from e
        if resp.status_code != 200:
            raise error_from_response(resp.status_code, resp.content, resp.headers)
        return resp.json()

    def check_service(self) -> tuple[bool, str, list[str]]:
        """(all healthy, "healthy/total", healthy backend ids) — more telling than /v1/models."""
        try:
            status = self.lb_status()
        except ServiceError as e:
            log.warning("check_service: %s", e)
            return False, "0/0", []
        healthy, total = status.get("healthy", 0), status.get("total", 0)
        ids = [_backend_id(b.get("url", "")) for b in status.get("backends", []) if b.get("healthy")]
        return total > 0 and healthy == total, f"{healthy}/{total}", ids


def _backend_id(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


def _check_truncation(result: Result, strict: bool, max_tokens: int) -> Result:
    if result.truncated:
        msg = (f"answer for orid {result.orid} was cut at max_tokens={max_tokens} (finish_reason=length): "
               "raise max_tokens or disable thinking")
        if strict:
            raise TruncatedError(msg, result=result, request_id=result.request_id, backend=result.backend)
        log.warning(msg)
    return result


class Stream:
    """Iterate for answer text pieces as they arrive; after the end, read finish_reason and usage."""

    def __init__(self, client: Client, body: dict, orid: str, enable_thinking: bool, show_thinking: bool,
                 strict: bool, max_tokens: int):
        self.client, self.body, self.orid = client, body, orid
        self.show_thinking, self.strict, self.max_tokens = show_thinking, strict, max_tokens
        self.splitter = ThinkingSplitter(expect_thinking=enable_thinking)
        self.finish_reason: str | None = None
        self.usage: dict = {}
        self.backend: str | None = None
        self.request_id: str | None = None
        self.attempts = 0
        self.latency_s: float | None = None
        self.result: Result | None = None

    def __iter__(self) -> Iterator[str]:
        if self.attempts:
            raise RuntimeError("a Stream can be iterated once: call recognize_stream again for a new request")
        started = time.monotonic()
        resp, self.attempts = self.client._post(self.body, stream=True)
        self.backend = resp.headers.get("X-Backend")
        self.request_id = resp.headers.get("X-Request-Id")
        with resp:
            try:
                yield from self._pieces(resp)
            except requests.RequestException as e:
                where = dict(request_id=self.request_id, backend=self.backend)
                if "timed out" in str(e):
                    raise ServiceTimeout(
                        f"the stream stalled beyond the client timeout of {self.client.timeout}s", **where) from e
                raise BackendError(f"the stream broke before [DONE]: {e}", **where) from e
        rest = self.splitter.finish()
        if rest:
            yield rest
        self.latency_s = round(time.monotonic() - started, 4)
        self.result = _check_truncation(Result(
            answer=self.splitter.answer.strip(), thinking=self.splitter.thinking.strip(),
            finish_reason=self.finish_reason, backend=self.backend, request_id=self.request_id,
            orid=self.orid, prompt_tokens=self.usage.get("prompt_tokens"),
            completion_tokens=self.usage.get("completion_tokens"), latency_s=self.latency_s,
            attempts=self.attempts), self.strict, self.max_tokens)

    def _pieces(self, resp: requests.Response) -> Iterator[str]:
        saw_reasoning = False
        # chunk_size=None: hand over bytes as they arrive instead of waiting for 512 of them
        for line in resp.iter_lines(chunk_size=None):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            event = json.loads(data)
            if "error" in event:
                raise error_from_response(200, event, resp.headers)
            if event.get("usage"):
                self.usage = event["usage"]
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                reasoning = delta.get("reasoning") or delta.get("reasoning_content")
                if reasoning:
                    saw_reasoning = True
                    self.splitter.thinking += reasoning
                    if self.show_thinking:
                        yield reasoning
                content = delta.get("content")
                if content:
                    if saw_reasoning and self.splitter.state == "undecided":
                        self.splitter.state = "answer"  # the server splits thinking out itself
                    yield from self._emit(content)
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]

    def _emit(self, content: str) -> Iterator[str]:
        before = len(self.splitter.thinking)
        answer = self.splitter.feed(content)
        if self.show_thinking and len(self.splitter.thinking) > before:
            yield self.splitter.thinking[before:]
        if answer:
            yield answer


_default_clients: dict = {}


def _client(base_url: str | None, timeout: float) -> Client:
    key = (_base_url(base_url), timeout)
    if key not in _default_clients:
        _default_clients[key] = Client(base_url, timeout=timeout)
    return _default_clients[key]


def recognize(image, prompt: str = DEFAULT_PROMPT, orid=None, max_tokens: int = 1024,
              temperature: float = 0.3, enable_thinking: bool = True, base_url: str | None = None,
              timeout: float = DEFAULT_TIMEOUT, strict: bool = False) -> Result:
    """Describe one image (path or bytes) or up to 9; the answer comes with thinking stripped."""
    return _client(base_url, timeout).recognize(
        image, prompt, orid=orid, max_tokens=max_tokens, temperature=temperature,
        enable_thinking=enable_thinking, strict=strict)


def recognize_stream(image, prompt: str = DEFAULT_PROMPT, orid=None, max_tokens: int = 1024,
                     temperature: float = 0.3, enable_thinking: bool = True, base_url: str | None = None,
                     timeout: float = DEFAULT_TIMEOUT, show_thinking: bool = False,
                     strict: bool = False) -> Stream:
    """Like recognize, as a Stream of answer pieces; .result/.usage/.finish_reason after the end."""
    return _client(base_url, timeout).recognize_stream(
        image, prompt, orid=orid, max_tokens=max_tokens, temperature=temperature,
        enable_thinking=enable_thinking, show_thinking=show_thinking, strict=strict)


def check_service(base_url: str | None = None) -> tuple[bool, str, list[str]]:
    """(True, "8/8", ["127.0.0.1:8002", ...]) when every backend behind the proxy is healthy."""
    return _client(base_url, DEFAULT_TIMEOUT).check_service()

