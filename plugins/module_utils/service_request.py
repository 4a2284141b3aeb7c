# -*- coding: utf-8 -*-
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""One real request of a model service's kind (chat, vision, embedding, rerank, transcription, speech), and what
its answer must hold to prove the service works: shared by cluster_health (through the proxy) and
service_request (to one instance, e.g. the canary of an upgrade)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import struct

from ansible.module_utils.urls import prepare_multipart

from ansible_collections.dcu.serving.plugins.module_utils.dcu_http import request

# An 8x8 white PNG: the smallest honest image for a functional request.
PROBE_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAFUlEQVR42mP8//8/AzbAxIADDE4JAFbUAw3/dxQWAAAAAElFTkSuQmCC"


def _wav(seconds=0.5, rate=16000):
    """A short silent 16-bit mono WAV: the smallest honest audio for a transcription request."""
    frames = int(seconds * rate)
    data = b"\x00\x00" * frames
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate,
            rate * 2, 2, 16) + b"data" + struct.pack("<I", len(data)) + data)


def _chat(model, orid, image):
    content = [{"type": "text", "text": "Describe the image in one sentence." if image else "Say OK."}]
    if image:
        content.insert(0, {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PROBE_PNG}})
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 16,
            "temperature": 0.2, "user": orid, "chat_template_kwargs": {"enable_thinking": False}}


def answer_problem(api, body, raw=b""):
    """Why an answer of `api` does not prove the service works, or None. `raw`: the answer's bytes (speech is
    audio, not JSON)."""
    if api == "speech":
        if not (raw[:4] == b"RIFF" and raw[8:12] == b"WAVE" and len(raw) > 44):
            return "the answer is no WAV audio (%d bytes: %r)" % (len(raw), raw[:60])
        return None
    body = body or {}
    if api == "chat":
        choice = (body.get("choices") or [{}])[0]
        if not (choice.get("message") or {}).get("content"):
            return "the answer was empty (finish_reason %s)" % choice.get("finish_reason")
    elif api == "embeddings":
        if not ((body.get("data") or [{}])[0].get("embedding")):
            return "the answer holds no embedding"
    elif api == "rerank":
        if not body.get("results"):
            return "the answer ranks no document"
    elif api == "transcriptions" and "text" not in body:
        return "the answer holds no text"
    return None


def send_request(url, kind, model, orid, timeout):
    """(api, HttpResult) of one real request of the service's kind to url (a proxy or one vLLM instance)."""
    base = url.rstrip("/")
    if kind == "embedding":
        return "embeddings", request(base + "/v1/embeddings", method="POST", timeout=timeout,
                                     payload={"model": model, "input": "dcu-serving verify", "user": orid})
    if kind == "rerank":
        return "rerank", request(base + "/v1/rerank", method="POST", timeout=timeout, payload={
            "model": model, "query": "DCU card", "documents": ["a DCU card serves models", "bread"], "user": orid})
    if kind == "transcription":
        content_type, body = prepare_multipart({"model": model, "user": orid, "response_format": "json", "file": {
            "filename": "verify.wav", "content": _wav(), "mime_type": "audio/wav"}})
        return "transcriptions", request(base + "/v1/audio/transcriptions", method="POST", timeout=timeout,
                                         data=body, content_type=content_type)
    if kind == "speech":
        return "speech", request(base + "/v1/audio/speech", method="POST", timeout=timeout, payload={
            "model": model, "input": "dcu-serving verify.", "response_format": "wav", "user": orid})
    return "chat", request(base + "/v1/chat/completions", method="POST", timeout=timeout,
                           payload=_chat(model, orid, image=kind != "chat"))


def server_error(res):
    """What a non-200 answer says went wrong: its OpenAI-style error message, else the start of its body."""
    err = (res.body or {}).get("error") if isinstance(res.body, dict) else None
    return err.get("message") if isinstance(err, dict) else res.raw[:300]
