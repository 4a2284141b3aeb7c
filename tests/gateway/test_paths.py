"""Which of the gateway's paths a key reaches: a caller's the inference paths only, a probe key every path -
LiteLLM's /health sends a completion to every deployment, past routing, drains and limits."""

from __future__ import annotations

import pytest

from dcu_serving.gateway import paths


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/chat/completions", "/v1/embeddings", "/v1/rerank",
                                  "/v2/rerank", "/v1/audio/transcriptions", "/v1/audio/speech",
                                  "/v1/models", "/v1/completions/", "/mineru/dcu-a/file_parse",
                                  "/mineru/dcu-a/tasks/0b7e2c52-5f1e-4c8a-9d3b-6a1f2e4d5c6b/result"])
def test_a_callers_key_reaches_the_inference_paths(path):
    assert paths.allowed(path, probe=False) and paths.allowed(path, probe=True)


@pytest.mark.parametrize("path", ["/health", "/health/readiness", "/key/generate", "/model/new", "/spend/logs",
                                  "/v1/chat/completions/../health", "/ui", "/", "/mineru",
                                  "/v1/mineru/x"])
def test_only_a_probe_key_reaches_the_others(path):
    assert not paths.allowed(path, probe=False) and paths.allowed(path, probe=True)
    assert f"not {path}; health and the other paths take a probe key" in paths.refusal(path)
