"""Helpers for the simulator tests: requests, images, SSE and metrics parsing."""

from __future__ import annotations

import base64
import io
import json

import requests
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from support import SERVED_MODEL


def body(text: str = "Read the text in this picture.", images: int = 0, **extra) -> dict:
    content = [{"type": "text", "text": text}] + [
        {"type": "image_url", "image_url": {"url": png_uri()}} for _ in range(images)
    ]
    return {"model": SERVED_MODEL, "messages": [{"role": "user", "content": content}], **extra}


def png_uri(width: int = 64, height: int = 48) -> str:
    out = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def chat(server, payload, timeout: float = 10, headers: dict | None = None, **kw) -> requests.Response:
    data = payload if isinstance(payload, (str, bytes)) else json.dumps(payload)
    return requests.post(server.url + "/v1/chat/completions", data=data, timeout=timeout,
                         headers={"Content-Type": "application/json", **(headers or {})}, **kw)


def content_of(events: list) -> str:
    return "".join(e["choices"][0]["delta"].get("content", "") for e in events
                   if isinstance(e, dict) and e["choices"])


def metrics(server) -> dict:
    """{(name, frozenset(labels)): value} for every vllm: sample."""
    text = requests.get(server.url + "/metrics", timeout=5).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("vllm:")}


def metric(server, name: str, **labels) -> float:
    labels = {"model_name": SERVED_MODEL, "engine": "0", **labels}
    return metrics(server)[(name, frozenset(labels.items()))]


# Model directories as vLLM finds them (config.json; the tokenizer beside it unless told otherwise).
EMBEDDER = {"architectures": ["XLMRobertaModel"], "max_position_embeddings": 8194, "num_attention_heads": 16}
RERANKER = {"architectures": ["XLMRobertaForSequenceClassification"], "max_position_embeddings": 8194}
WHISPER = {"architectures": ["WhisperForConditionalGeneration"], "max_target_positions": 448}
DECODER = {"architectures": ["Qwen3ForCausalLM"], "max_position_embeddings": 32768, "num_attention_heads": 32}


def model_dir(root, name: str, config: dict, tokenizer: bool = True):
    path = root / "models" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if tokenizer:
        (path / "tokenizer_config.json").write_text("{}")
    return path


def post(server, path: str, payload, timeout: float = 10, **kw) -> requests.Response:
    return requests.post(server.url + path, json=payload, timeout=timeout, **kw)
