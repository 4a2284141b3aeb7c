"""vLLM's generative APIs: /v1/chat/completions and /v1/completions (served when the runner is "generate")."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import time

from aiohttp import web

from dcu_serving.sim import citations, mineru
from dcu_serving.sim.config import SimConfig
from dcu_serving.sim.engine import THINK_CLOSE, THINK_OPEN, Engine, Sequence, plan
from dcu_serving.sim.faults import EngineError, Faults
from dcu_serving.sim.protocol import (
    APIError,
    CompletionRequest,
    check_length,
    check_sampling,
    count_prompt,
    error_body,
    parse_request,
    text_tokens,
)
from dcu_serving.sim.shared import admit, engine_key, json_response, require
from dcu_serving.sim.shared import request_id as base_request_id

log = logging.getLogger("dcu_serving.sim")

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
DONE = b"data: [DONE]\n\n"
THINK_TAGS = (THINK_OPEN, THINK_CLOSE)


# --- chat completions ----------------------------------------------------------------------------

class Encoder:
    """SSE bytes for one stream: every piece shares the same envelope, so encode it once."""

    def __init__(self, request_id: str, created: int, model: str):
        self.head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}
        prefix = b"data: " + json.dumps(self.head, separators=(",", ":"))[:-1].encode()
        self.content = prefix + b',"choices":[{"index":0,"delta":{"content":'
        self.reasoning = prefix + b',"choices":[{"index":0,"delta":{"reasoning_content":'
        self.tail = b'},"logprobs":null,"finish_reason":null}]}\n\n'

    def piece(self, text: str, reasoning: bool) -> bytes:
        return (self.reasoning if reasoning else self.content) + json.dumps(text).encode() + self.tail

    def event(self, **fields) -> bytes:
        return b"data: " + json.dumps({**self.head, **fields}, separators=(",", ":")).encode() + b"\n\n"

    def role(self) -> bytes:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return self.event(choices=[choice])

    def finish(self, delta: dict, reason: str) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason, "stop_reason": None}
        return self.event(choices=[choice])


def _usage(*seqs: Sequence) -> dict:
    prompt = sum(seq.prompt_tokens for seq in seqs)
    completion = sum(seq.generated for seq in seqs)
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


def _split(seq: Sequence, reasoning_parser: bool) -> tuple[str | None, str | None]:
    """(reasoning_content, content): with a reasoning parser the <think> block moves out of content."""
    if not reasoning_parser:
        return None, "".join(seq.pieces)
    think = seq.pieces[:seq.thinking_pieces]
    reasoning = "".join(p for p in think if p not in THINK_TAGS) if think else None
    return reasoning, "".join(seq.pieces[seq.thinking_pieces:])


async def chat_completions(request: web.Request, config: SimConfig, faults: Faults) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    body = parse_request(await request.read())
    require(config, {"generate"}, "Chat Completions API")
    admit(body, config, faults)
    max_tokens = check_sampling(body)
    prompt_tokens, images = count_prompt(body.messages, config.image_limit)
    max_tokens = check_length(prompt_tokens, max_tokens, config.max_model_len)

    request_id = f"chatcmpl-{base_request_id(request)}"
    key = {"messages": body.messages, "temperature": body.temperature, "seed": body.seed,
           "thinking": body.thinking}
    mineru_task = mineru.task(body.messages)
    if mineru_task is not None:  # MinerU's VLM protocol: layout boxes, then each block's content; no thinking
        answer = mineru.pieces(mineru.answer(*mineru_task, config.seed))
        finish = "length" if len(answer) > max_tokens else "stop"
        seq = Sequence(request_id, prompt_tokens, images, answer[:max_tokens], finish, 0, random.Random(0))
    else:
        seq = plan(config, key, prompt_tokens, images, body.thinking, max_tokens, request_id)
        source = citations.cited(body.messages)
        if source is not None and len(seq.pieces) < max_tokens:  # a RAG prompt: cite the best-matching source
            seq.pieces.append(f" [{source}]")
    model = body.model or config.served_model_names[0]
    engine = request.app[engine_key]
    if body.stream:
        return await _stream(request, engine, seq, model, body.include_usage)
    return await _complete(engine, seq, model)


async def _complete(engine: Engine, seq: Sequence, model: str) -> web.Response:
    created = int(time.time())
    try:
        await generate(engine, seq)
    except EngineError as e:
        raise APIError(str(e), 500, "InternalServerError") from None
    reasoning, content = _split(seq, engine.config.reasoning_parser is not None)
    message = {"role": "assistant", "content": content, "refusal": None, "annotations": None, "audio": None,
               "function_call": None, "tool_calls": [], "reasoning_content": reasoning}
    log_done(seq, "complete")
    return json_response({
        "id": seq.request_id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": seq.finish_reason,
                     "stop_reason": None}],
        "service_tier": None, "system_fingerprint": None,
        "usage": {**_usage(seq), "prompt_tokens_details": None},
        "prompt_logprobs": None, "kv_transfer_params": None,
    })


async def _stream(request: web.Request, engine: Engine, seq: Sequence, model: str,
                  include_usage: bool) -> web.StreamResponse:
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)  # like vLLM: 200 and headers at once, chunks when tokens come
    enc = Encoder(seq.request_id, int(time.time()), model)
    split = engine.config.reasoning_parser is not None
    last = len(seq.pieces) - 1
    try:
        async with engine.run(seq) as timer:
            for i, text in enumerate(seq.pieces):
                await timer.next_token()
                thinking = i < seq.thinking_pieces
                if split and thinking and text in THINK_TAGS:
                    text = None  # the parser swallows the tags
                if i == last:
                    delta = {} if text is None else {("reasoning_content" if split and thinking else "content"): text}
                    chunk = enc.finish(delta, seq.finish_reason)
                elif text is None:
                    chunk = b""
                else:
                    chunk = enc.piece(text, split and thinking)
                if i == 0:
                    chunk = enc.role() + chunk
                if chunk:
                    await response.write(chunk)
        tail = enc.event(choices=[], usage=_usage(seq)) if include_usage else b""
        await response.write(tail + DONE)
        await response.write_eof()
    except EngineError as e:
        # Headers and 200 are out: like vLLM, the error travels as an event, then [DONE].
        log.warning("request %s: %s", seq.request_id, e)
        await response.write(b"data: " + json.dumps(error_body(str(e), "InternalServerError", 500)).encode()
                             + b"\n\n" + DONE)
        await response.write_eof()
        return response
    except ConnectionResetError:
        log_abort(seq)
        return response
    except asyncio.CancelledError:
        log_abort(seq)
        raise
    log_done(seq, "stream")
    return response


# --- text completions ----------------------------------------------------------------------------

async def text_completions(request: web.Request, config: SimConfig, faults: Faults) -> web.StreamResponse:
    """POST /v1/completions: each prompt of a batch is its own sequence in the engine and its own choice."""
    body = parse_request(await request.read(), CompletionRequest)
    require(config, {"generate"}, "Completions API")
    admit(body, config, faults)
    if body.suffix is not None:
        raise APIError("suffix is not currently supported", param="suffix")
    max_tokens = check_sampling(body)
    request_id = f"cmpl-{base_request_id(request)}"
    seqs, echoes = [], []
    for index, prompt in enumerate(body.prompts):
        tokens = len(prompt) if isinstance(prompt, list) else text_tokens(prompt)
        if body.echo and isinstance(prompt, list):
            raise APIError("echo with a prompt of token ids needs a tokenizer to print the prompt, and the "
                           "simulator has none: send the prompt as text", param="echo")
        budget = check_length(tokens, max_tokens, config.max_model_len, "prompt")
        key = {"prompt": prompt, "temperature": body.temperature, "seed": body.seed}
        seqs.append(plan(config, key, tokens, 0, False, budget, f"{request_id}-{index}"))
        echoes.append(prompt if body.echo else "")
    model = body.model or config.served_model_names[0]
    created = int(time.time())
    engine = request.app[engine_key]
    if body.stream:
        enc = TextEncoder(request_id, created, model)
        return await _text_stream(request, engine, seqs, echoes, enc, body.include_usage)
    try:
        await side_by_side(generate(engine, seq) for seq in seqs)
    except EngineError as e:
        raise APIError(str(e), 500, "InternalServerError") from None
    for seq in seqs:
        log_done(seq, "complete")
    return json_response({
        "id": request_id, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": i, "text": echo + "".join(seq.pieces), "logprobs": None,
                     "finish_reason": seq.finish_reason, "stop_reason": None, "prompt_logprobs": None}
                    for i, (seq, echo) in enumerate(zip(seqs, echoes, strict=True))],
        "service_tier": None, "system_fingerprint": None,
        "usage": {**_usage(*seqs), "prompt_tokens_details": None}, "kv_transfer_params": None,
    })


class TextEncoder:
    """SSE bytes of a text completion stream, as vLLM's CompletionStreamResponse serialises them."""

    def __init__(self, request_id: str, created: int, model: str):
        self.head = {"id": request_id, "object": "text_completion", "created": created, "model": model}
        self.prefix = b"data: " + json.dumps(self.head, separators=(",", ":"))[:-1].encode() + b',"choices":[{"index":'

    def piece(self, index: int, text: str, finish_reason: str | None) -> bytes:
        reason = json.dumps(finish_reason).encode()
        return (self.prefix + str(index).encode() + b',"text":' + json.dumps(text).encode()
                + b',"logprobs":null,"finish_reason":' + reason + b',"stop_reason":null}]}\n\n')

    def usage(self, seqs: list[Sequence]) -> bytes:
        return b"data: " + json.dumps({**self.head, "choices": [], "usage": _usage(*seqs)},
                                      separators=(",", ":")).encode() + b"\n\n"


async def _text_stream(request: web.Request, engine: Engine, seqs: list[Sequence], echoes: list[str],
                       enc: TextEncoder, include_usage: bool) -> web.StreamResponse:
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)

    async def send(index: int, piece: int, text: str, seq: Sequence):
        if piece == 0:
            text = echoes[index] + text
        last = piece == len(seq.pieces) - 1
        await response.write(enc.piece(index, text, seq.finish_reason if last else None))

    try:
        await side_by_side(generate(engine, seq, functools.partial(send, i)) for i, seq in enumerate(seqs))
        await response.write((enc.usage(seqs) if include_usage else b"") + DONE)
        await response.write_eof()
    except EngineError as e:
        log.warning("request %s: %s", enc.head["id"], e)
        await response.write(b"data: " + json.dumps(error_body(str(e), "InternalServerError", 500)).encode()
                             + b"\n\n" + DONE)
        await response.write_eof()
        return response
    except ConnectionResetError:  # the caller left; _generate logged each sequence it cut short
        return response
    for seq in seqs:
        log_done(seq, "stream")
    return response


async def generate(engine: Engine, seq: Sequence, send=None):
    """Run one sequence through the engine; `send(piece number, text, seq)` as each token is made."""
    try:
        async with engine.run(seq) as timer:
            for i, text in enumerate(seq.pieces):
                await timer.next_token()
                if send is not None:
                    await send(i, text, seq)
    except (asyncio.CancelledError, ConnectionResetError):
        log_abort(seq)
        raise


async def side_by_side(runs):
    """Await the runs of one request together; the first failure stops the others and is raised as it is."""
    tasks = [asyncio.ensure_future(run) for run in runs]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # none left running, no failure left unread


def log_abort(seq: Sequence):
    log.info("request %s: client disconnected, aborted after %d tokens", seq.request_id, seq.generated)


def log_done(seq: Sequence, mode: str):
    # Never the prompt or images: counts and outcome only.
    log.info("request %s (%s): prompt_tokens=%d images=%d completion_tokens=%d finish_reason=%s e2e=%.3fs",
             seq.request_id, mode, seq.prompt_tokens, seq.images, seq.generated, seq.finish_reason,
             time.monotonic() - seq.arrival)
