"""Pooling models as a client sees them: /v1/embeddings, /rerank and /score in vLLM 0.11's shapes and errors."""

from __future__ import annotations

import asyncio
import base64
import math
import struct
import time

import aiohttp
import openai
import pytest
import requests
from sim.simtools import EMBEDDER, RERANKER, body, chat, metric, post

FAST = ("--sim-ttft-ms", "5")
QUERY = "What is the capital of France?"
DOCUMENTS = ["Berlin is the capital of Germany.", "The capital of France is Paris.", "Cats sleep a lot."]


@pytest.fixture
def embedder(start_sim):
    return start_sim(*FAST, served_model_name="bge-m3", model_config=EMBEDDER)


@pytest.fixture
def reranker(start_sim):
    return start_sim(*FAST, served_model_name="bge-reranker-v2-m3", model_config=RERANKER)


def embed(server, payload) -> dict:
    r = post(server, "/v1/embeddings", payload)
    assert r.status_code == 200, r.text
    return r.json()


def error_of(response, status: int = 400, http_status: int | None = None) -> str:
    assert response.status_code == (http_status or status), response.text
    error = response.json()["error"]
    assert (error["code"], error["type"]) == (status, "BadRequestError")
    return error["message"]


# --- /v1/embeddings ------------------------------------------------------------------------------


def test_embeddings_are_deterministic_normalised_vectors(embedder):
    answer = embed(embedder, {"model": "bge-m3", "input": ["hello world", "hello world", "good night"]})
    assert answer["id"].startswith("embd-") and (answer["object"], answer["model"]) == ("list", "bge-m3")
    vectors = [d["embedding"] for d in answer["data"]]
    assert [d["index"] for d in answer["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" for d in answer["data"])
    assert all(len(v) == 1024 for v in vectors)  # no hidden_size in config.json: the default size
    assert all(abs(math.fsum(x * x for x in v) - 1) < 1e-9 for v in vectors)
    assert vectors[0] == vectors[1] != vectors[2]
    assert answer["usage"] == {"prompt_tokens": answer["usage"]["prompt_tokens"],
                               "total_tokens": answer["usage"]["prompt_tokens"], "completion_tokens": 0,
                               "prompt_tokens_details": None}
    assert embed(embedder, {"input": "hello world"})["data"][0]["embedding"] == vectors[0]


def test_embedding_size_follows_the_flag_and_the_seed_changes_vectors(start_sim, embedder):
    small = start_sim(*FAST, "--sim-embedding-dim", "64", "--sim-seed", "3", served_model_name="small",
                      model_config=EMBEDDER)
    vector = embed(small, {"input": "hello world"})["data"][0]["embedding"]
    assert len(vector) == 64
    assert vector != embed(embedder, {"input": "hello world"})["data"][0]["embedding"][:64]


def test_openai_sdk_float_and_base64(embedder):
    client = openai.OpenAI(base_url=embedder.url + "/v1", api_key="unused", max_retries=0)
    plain = client.embeddings.create(model="bge-m3", input=["one text"], encoding_format="float")
    raw = base64.b64decode(embed(embedder, {"input": "one text", "encoding_format": "base64"})["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(decoded) == 1024
    assert all(abs(a - b) < 1e-6 for a, b in zip(decoded, plain.data[0].embedding, strict=True))


def test_token_ids_and_batches(embedder):
    one = embed(embedder, {"input": [101, 2023, 102]})
    assert len(one["data"]) == 1 and one["usage"]["prompt_tokens"] == 3
    batch = embed(embedder, {"input": [[101, 2023, 102], [7, 8]]})
    assert len(batch["data"]) == 2 and batch["usage"]["prompt_tokens"] == 5
    assert batch["data"][0]["embedding"] == one["data"][0]["embedding"]


def test_empty_input(embedder):
    assert error_of(post(embedder, "/v1/embeddings", {"input": []})) == "please provide at least one prompt"
    assert error_of(post(embedder, "/v1/embeddings", {"input": [[]]})) == "please provide at least one prompt"
    # An encoder model wraps even an empty text in [CLS] ... [SEP]: a vector for 2 tokens, like bge-m3.
    assert embed(embedder, {"input": ""})["usage"]["prompt_tokens"] == 2
    missing = post(embedder, "/v1/embeddings", {"model": "bge-m3"})
    assert missing.status_code == 400 and missing.json()["error"]["type"] == "Bad Request"


def test_decoder_embedder_refuses_an_empty_prompt(start_sim):
    server = start_sim(*FAST, "--runner", "pooling", served_model_name="qwen3-embedding",
                       model_config={"architectures": ["Qwen3ForCausalLM"]})
    assert error_of(post(server, "/v1/embeddings", {"input": ""})) == "The decoder prompt cannot be empty"


def test_dimensions_need_a_matryoshka_model(start_sim, embedder):
    refused = post(embedder, "/v1/embeddings", {"input": "x", "dimensions": 256})
    assert error_of(refused) == ('Model "bge-m3" does not support matryoshka representation, changing output '
                                 "dimensions will lead to poor results.")
    server = start_sim(*FAST, served_model_name="mrl", model_config={**EMBEDDER, "is_matryoshka": True})
    short = embed(server, {"input": "x", "dimensions": 32})["data"][0]["embedding"]
    assert len(short) == 32 and abs(math.fsum(v * v for v in short) - 1) < 1e-9
    listed = start_sim(*FAST, served_model_name="listed",
                       model_config={**EMBEDDER, "matryoshka_dimensions": [128, 256]})
    assert len(embed(listed, {"input": "x", "dimensions": 128})["data"][0]["embedding"]) == 128
    assert "only supports [128, 256] matryoshka dimensions" in error_of(
        post(listed, "/v1/embeddings", {"input": "x", "dimensions": 100}))


def test_context_length_and_unknown_model(embedder):
    too_long = post(embedder, "/v1/embeddings", {"input": "word " * 8000})
    assert error_of(too_long).startswith("This model's maximum context length is 8194 tokens. However, you "
                                         "requested 10002 tokens in the input for embedding generation.")
    truncated = embed(embedder, {"input": "word " * 8000, "truncate_prompt_tokens": 100})
    assert truncated["usage"]["prompt_tokens"] == 100
    unknown = post(embedder, "/v1/embeddings", {"model": "gpt-4", "input": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"]["message"] == "The model `gpt-4` does not exist."


def test_models_card_has_the_same_shape_for_a_pooling_model(embedder):
    [card] = requests.get(embedder.url + "/v1/models", timeout=5).json()["data"]
    assert (card["id"], card["object"], card["owned_by"], card["max_model_len"]) == ("bge-m3", "model", "vllm", 8194)


# --- /rerank and /score ---------------------------------------------------------------------------


def test_reranker_puts_the_document_with_the_query_words_first(reranker):
    r = post(reranker, "/rerank", {"model": "bge-reranker-v2-m3", "query": QUERY, "documents": DOCUMENTS},
             headers={"X-Request-Id": "q-1"})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert (answer["id"], answer["model"]) == ("rerank-q-1", "bge-reranker-v2-m3")
    results = answer["results"]
    assert results[0]["index"] == 1
    assert results[0]["document"] == {"text": DOCUMENTS[1], "multi_modal": None}
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True) and 0 < scores[-1] < 0.5 < scores[0] < 1
    assert answer["usage"]["total_tokens"] > 0
    for path in ("/v1/rerank", "/v2/rerank"):
        assert post(reranker, path, {"query": QUERY, "documents": DOCUMENTS}).json()["results"] == results
    top = post(reranker, "/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 1}).json()["results"]
    assert top == results[:1]


def test_score_pairs_one_to_one_one_to_many_and_many_to_many(reranker):
    def scores(text_1, text_2):
        r = post(reranker, "/score", {"text_1": text_1, "text_2": text_2})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["id"].startswith("score-") and answer["object"] == "list"
        assert [d["index"] for d in answer["data"]] == list(range(len(answer["data"])))
        return [d["score"] for d in answer["data"]]

    many = scores(QUERY, DOCUMENTS)
    assert max(many) == many[1]
    assert scores(QUERY, DOCUMENTS[1]) == [many[1]]
    assert scores([QUERY, QUERY], DOCUMENTS[:2]) == many[:2]
    assert post(reranker, "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS}).json()["data"][1]["score"] == many[1]


@pytest.mark.parametrize("payload, message", [
    ({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "Input lengths must be either 1:1, 1:N or N:N"),
    ({"text_1": [], "text_2": ["a"]}, "At least one text element must be given"),
    ({"text_1": "a", "text_2": []}, "At least one text_pair element must be given"),
])
def test_score_input_errors(reranker, payload, message):
    assert error_of(post(reranker, "/score", payload)) == message


def test_empty_documents_for_rerank(reranker):
    assert error_of(post(reranker, "/rerank", {"query": "a", "documents": []})) == \
        "At least one text_pair element must be given"


def test_embedding_model_reranks_by_cosine_of_its_embeddings(embedder):
    answer = post(embedder, "/rerank", {"query": QUERY, "documents": DOCUMENTS}).json()
    assert answer["results"][0]["index"] == 1
    vectors = [d["embedding"] for d in embed(embedder, {"input": [QUERY, *DOCUMENTS]})["data"]]
    cosines = [math.fsum(a * b for a, b in zip(vectors[0], v, strict=True)) for v in vectors[1:]]
    by_index = {x["index"]: x["relevance_score"] for x in answer["results"]}
    assert all(abs(by_index[i] - c) < 1e-9 for i, c in enumerate(cosines))
    score = post(embedder, "/score", {"text_1": QUERY, "text_2": DOCUMENTS[1]}).json()["data"][0]["score"]
    assert abs(score - cosines[1]) < 1e-9


# --- which model serves which API ----------------------------------------------------------------


@pytest.mark.parametrize("server, path, payload, api", [
    ("sim", "/v1/embeddings", {"input": "x"}, "Embeddings API"),
    ("sim", "/rerank", {"query": "a", "documents": ["b"]}, "Rerank (Score) API"),
    ("sim", "/score", {"text_1": "a", "text_2": "b"}, "Score API"),
    ("embedder", "/v1/chat/completions", body(), "Chat Completions API"),
    ("embedder", "/v1/completions", {"prompt": "hi"}, "Completions API"),
    ("reranker", "/v1/embeddings", {"input": "x"}, "Embeddings API"),
])
def test_an_api_the_model_does_not_serve_is_a_400_envelope_under_http_200(request, server, path, payload, api):
    r = post(request.getfixturevalue(server), path, payload)
    assert error_of(r, 400, http_status=200) == f"The model does not support {api}"


def test_pooling_metrics_keep_vllm_names(reranker):
    post(reranker, "/score", {"text_1": QUERY, "text_2": DOCUMENTS})
    assert metric(reranker, "vllm:request_success_total", model_name="bge-reranker-v2-m3",
                  finished_reason="stop") == 3
    assert metric(reranker, "vllm:prompt_tokens_total", model_name="bge-reranker-v2-m3") > 0
    assert metric(reranker, "vllm:generation_tokens_total", model_name="bge-reranker-v2-m3") == 0


async def test_pooling_requests_wait_for_a_slot_like_the_others(start_sim):
    # Each embedding takes 300 ms; with one slot, three at once take three times as long as one.
    server = start_sim("--sim-ttft-ms", "300", "--max-num-seqs", "1", served_model_name="slow",
                       model_config=EMBEDDER)
    async with aiohttp.ClientSession() as session:
        async def one(i):
            async with session.post(server.url + "/v1/embeddings", json={"input": f"text {i}"}) as r:
                assert r.status == 200

        start = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(3)))
        elapsed = time.monotonic() - start
    assert elapsed >= 0.85
    assert metric(server, "vllm:request_queue_time_seconds_sum", model_name="slow") >= 0.8


def test_chat_still_served_by_a_generative_model(sim):
    assert chat(sim, body(max_tokens=2)).json()["choices"][0]["finish_reason"] == "length"

