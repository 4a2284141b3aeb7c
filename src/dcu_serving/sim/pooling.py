"""vLLM's pooling APIs: /v1/embeddings, /rerank (also /v1/rerank, /v2/rerank) and /score (also /v1/score).

An embedding is a deterministic function of the text and --sim-seed: the sum of one pseudo-random vector
per word (so texts that share words point the same way), plus a little of the whole text, normalised.
An embedding model scores a pair by the cosine of their embeddings, as vLLM does; a cross-encoder
(`*ForSequenceClassification`, --convert classify) by how many of the query's words the document holds,
through a sigmoid. Either way the document that contains the query ranks first.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
import re
import struct
import time
from array import array
from typing import Annotated, Any, Literal, Optional, Union

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from dcu_serving.sim.config import SimConfig
from dcu_serving.sim.engine import Sequence
from dcu_serving.sim.faults import Faults
from dcu_serving.sim.generate import side_by_side
from dcu_serving.sim.protocol import APIError, parse_request, text_tokens
from dcu_serving.sim.shared import admit, engine_key, json_response, request_id, require

# A word: a run of letters/digits, or one CJK character (Chinese has no spaces between words).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
_WORD = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+")
WHOLE_TEXT_WEIGHT = 0.3


class _Body(BaseModel):
    """vLLM's OpenAIBaseModel: unknown fields are accepted (and logged as ignored)."""

    model_config = ConfigDict(extra="allow")


class EmbeddingCompletionRequest(_Body):
    model: Optional[str] = None
    input: Union[list[int], list[list[int]], str, list[str]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = None
    user: Optional[str] = None
    truncate_prompt_tokens: Optional[Annotated[int, Field(ge=-1)]] = None
    add_special_tokens: bool = True
    priority: int = 0
    normalize: Optional[bool] = None


class EmbeddingChatRequest(_Body):
    model: Optional[str] = None
    messages: list[dict[str, Any]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = None
    user: Optional[str] = None
    truncate_prompt_tokens: Optional[Annotated[int, Field(ge=-1)]] = None
    add_special_tokens: bool = False
    priority: int = 0
    normalize: Optional[bool] = None


EMBEDDING_REQUEST = TypeAdapter(Union[EmbeddingCompletionRequest, EmbeddingChatRequest])


class RerankRequest(_Body):
    model: Optional[str] = None
    query: Union[str, dict[str, Any]]
    documents: Union[list[str], dict[str, Any]]
    top_n: int = 0
    truncate_prompt_tokens: Optional[Annotated[int, Field(ge=-1)]] = None
    priority: int = 0
    activation: Optional[bool] = None


class ScoreRequest(_Body):
    model: Optional[str] = None
    text_1: Union[list[str], str, dict[str, Any]]
    text_2: Union[list[str], str, dict[str, Any]]
    truncate_prompt_tokens: Optional[Annotated[int, Field(ge=-1)]] = None
    priority: int = 0
    activation: Optional[bool] = None


# --- vectors and relevance -----------------------------------------------------------------------

def words(item: str | list[int]) -> list[str]:
    if isinstance(item, list):
        return [str(token) for token in item]
    return _WORD.findall(item.lower())


@functools.lru_cache(maxsize=65536)
def _unit_noise(seed: int, key: str, dim: int) -> tuple[float, ...]:
    """A fixed pseudo-random vector for `key`: int16s from SHAKE-256, in [-1, 1)."""
    raw = hashlib.shake_256(f"{seed}\0{key}".encode()).digest(2 * dim)
    return tuple(v / 32768 for v in array("h", raw))


def embedding(item: str | list[int], seed: int, dim: int) -> list[float]:
    """The raw (not normalised) vector of a text or a list of token ids."""
    key = item if isinstance(item, str) else " ".join(map(str, item))
    vector = [WHOLE_TEXT_WEIGHT * v for v in _unit_noise(seed, "\x01" + key, dim)]
    for word in words(item):
        vector = [a + b for a, b in zip(vector, _unit_noise(seed, word, dim), strict=True)]
    return vector


def normalised(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(normalised(a), normalised(b), strict=True))


def relevance_logit(query: str, document: str, seed: int) -> float:
    """A cross-encoder's logit: the share of the query's words found in the document, plus a little noise."""
    asked = set(words(query))
    share = len(asked & set(words(document))) / len(asked) if asked else 0.0
    noise = hashlib.sha256(f"{seed}\0{query}\0{document}".encode()).digest()[0] / 255 - 0.5
    return 8 * share - 4 + 0.5 * noise


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# --- token accounting ----------------------------------------------------------------------------

def count_tokens(config: SimConfig, item: str | list[int], special: bool = True) -> int:
    """Token ids count as they are; a text as UTF-8 bytes / 4, plus [CLS] and [SEP] on an encoder model."""
    if isinstance(item, list):
        return len(item)
    return text_tokens(item) + (2 if special and config.encoder_only else 0)


def check_prompt(config: SimConfig, tokens: int, truncate: int | None, operation: str) -> int:
    """vLLM's checks of one pooling prompt (after --truncate_prompt_tokens); returns its token count."""
    if truncate is not None:
        tokens = min(tokens, config.max_model_len if truncate == -1 else truncate)
    if tokens == 0:
        raise APIError("The decoder prompt cannot be empty")
    if tokens > config.max_model_len:
        raise APIError(f"This model's maximum context length is {config.max_model_len} tokens. However, you "
                       f"requested {tokens} tokens in the input for {operation}. Please reduce the length of "
                       "the input.")
    return tokens


def check_truncation(config: SimConfig, truncate: int | None):
    if truncate is not None and truncate > config.max_model_len:
        raise APIError(f"truncate_prompt_tokens value ({truncate}) is greater than max_model_len "
                       f"({config.max_model_len}). Please, select a smaller truncation size.")


async def _run(request: web.Request, prefix: str, token_counts: list[int]):
    """Each prompt is its own request in the engine (max-num-seqs and the waiting queue apply)."""
    engine = request.app[engine_key]
    seqs = [Sequence.pooling(f"{prefix}-{i}", n) for i, n in enumerate(token_counts)]
    await side_by_side(engine.pool(seq) for seq in seqs)


def _usage(tokens: int) -> dict:
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0, "prompt_tokens_details": None}


# --- /v1/embeddings -----------------------------------------------------------------------------

def _embedding_inputs(body: EmbeddingCompletionRequest | EmbeddingChatRequest) -> list[str | list[int]]:
    """vLLM's parse_and_batch_prompt: a text, a list of texts, a list of token ids, or a list of those."""
    if isinstance(body, EmbeddingChatRequest):
        parts = []
        for message in body.messages:
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts += [str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return ["\n".join(parts)]
    prompt = body.input
    if isinstance(prompt, str):
        return [prompt]
    if not prompt or (isinstance(prompt[0], list) and not prompt[0]):
        raise APIError("please provide at least one prompt")
    return [prompt] if isinstance(prompt[0], int) else list(prompt)


def _check_dimensions(config: SimConfig, dimensions: int | None):
    """vLLM's PoolingParams.verify: only a matryoshka model may shorten its vectors."""
    if dimensions is None:
        return
    name = config.model_name
    if not config.matryoshka:
        raise APIError(f'Model "{name}" does not support matryoshka representation, changing output dimensions '
                       "will lead to poor results.")
    allowed = config.matryoshka_dimensions
    if allowed is not None and dimensions not in allowed:
        raise APIError(f'Model "{name}" only supports {allowed} matryoshka dimensions, use other output '
                       "dimensions will lead to poor results.")
    if dimensions < 1:
        raise APIError("Dimensions must be greater than 0")


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":  # the float32 bytes, little-endian
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


async def embeddings(request: web.Request, config: SimConfig, faults: Faults) -> web.Response:
    """POST /v1/embeddings."""
    body = parse_request(await request.read(), EMBEDDING_REQUEST)
    require(config, {"embed"}, "Embeddings API")
    admit(body, config, faults)
    check_truncation(config, body.truncate_prompt_tokens)
    inputs = _embedding_inputs(body)
    tokens = [check_prompt(config, count_tokens(config, item, body.add_special_tokens), body.truncate_prompt_tokens,
                           "embedding generation") for item in inputs]
    _check_dimensions(config, body.dimensions)
    rid = request_id(request)
    await _run(request, f"embd-{rid}", tokens)
    data = []
    for index, item in enumerate(inputs):
        vector = embedding(item, config.seed, config.embedding_dim)[:body.dimensions or None]
        if body.normalize is not False:
            vector = normalised(vector)
        data.append({"index": index, "object": "embedding", "embedding": _encode(vector, body.encoding_format)})
    return json_response({"id": f"embd-{rid}", "object": "list", "created": int(time.time()),
                          "model": body.model or config.model_name, "data": data, "usage": _usage(sum(tokens))})


# --- /rerank and /score ---------------------------------------------------------------------------

def _texts(value, config: SimConfig) -> list[str]:
    if isinstance(value, dict):  # ScoreMultiModalParam: the simulated models take text only
        raise APIError(f"MultiModalParam is not supported for {config.architecture}")
    return [value] if isinstance(value, str) else list(value)


def _check_lengths(texts_1: list[str], texts_2: list[str]):
    """score_utils._validate_score_input_lens."""
    if len(texts_1) > 1 and len(texts_1) != len(texts_2):
        raise APIError("Input lengths must be either 1:1, 1:N or N:N")
    if not texts_1:
        raise APIError("At least one text element must be given")
    if not texts_2:
        raise APIError("At least one text_pair element must be given")


async def _scores(request: web.Request, config: SimConfig, prefix: str, texts_1: list[str], texts_2: list[str],
                  truncate: int | None, activation: bool | None, operation: str) -> tuple[list[float], int]:
    """One score per pair (1:N pairs the single text_1 with each text_2) and the prompt tokens used."""
    _check_lengths(texts_1, texts_2)
    check_truncation(config, truncate)
    pairs = list(zip(texts_1 * len(texts_2) if len(texts_1) == 1 else texts_1, texts_2, strict=True))
    counts = {text: count_tokens(config, text) for text in texts_1 + texts_2}
    if "classify" in config.tasks:  # a cross-encoder reads each pair as one prompt
        tokens = [check_prompt(config, counts[a] + counts[b], truncate, operation) for a, b in pairs]
        await _run(request, prefix, tokens)
        logits = [relevance_logit(a, b, config.seed) for a, b in pairs]
        return [x if activation is False else sigmoid(x) for x in logits], sum(tokens)
    # An embedding model embeds each text once and scores a pair by cosine similarity.
    await _run(request, prefix, [check_prompt(config, counts[t], truncate, operation) for t in texts_1 + texts_2])
    vectors = {t: embedding(t, config.seed, config.embedding_dim) for t in set(texts_1 + texts_2)}
    return [cosine(vectors[a], vectors[b]) for a, b in pairs], sum(counts[a] + counts[b] for a, b in pairs)


async def rerank(request: web.Request, config: SimConfig, faults: Faults) -> web.Response:
    """POST /rerank, /v1/rerank, /v2/rerank (Jina and Cohere clients): documents sorted by relevance."""
    body = parse_request(await request.read(), RerankRequest)
    require(config, {"embed", "score"}, "Rerank (Score) API")
    admit(body, config, faults)
    documents = _texts(body.documents, config)
    rid = f"rerank-{request_id(request)}"
    scores, tokens = await _scores(request, config, rid, _texts(body.query, config), documents,
                                   body.truncate_prompt_tokens, body.activation, "embedding generation")
    results = [{"index": i, "document": {"text": documents[i], "multi_modal": None}, "relevance_score": s}
               for i, s in enumerate(scores)]
    results.sort(key=lambda r: r["relevance_score"], reverse=True)
    top_n = body.top_n if body.top_n > 0 else len(documents)
    return json_response({"id": rid, "model": body.model or config.model_name, "usage": {"total_tokens": tokens},
                          "results": results[:top_n]})


async def score(request: web.Request, config: SimConfig, faults: Faults) -> web.Response:
    """POST /score, /v1/score: text_1 against text_2, 1:1, 1:N or N:N, scores in input order."""
    body = parse_request(await request.read(), ScoreRequest)
    require(config, {"embed", "score"}, "Score API")
    admit(body, config, faults)
    rid = f"score-{request_id(request)}"
    scores, tokens = await _scores(request, config, rid, _texts(body.text_1, config), _texts(body.text_2, config),
                                   body.truncate_prompt_tokens, body.activation, "score")
    return json_response({"id": rid, "object": "list", "created": int(time.time()),
                          "model": body.model or config.model_name,
                          "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
                          "usage": _usage(tokens)})
