"""/v1/audio/transcriptions for a Whisper model: multipart form, vLLM 0.11's answers and refusals."""

from __future__ import annotations

import io
import json
import os
import wave

import openai
import pytest
import requests
from sim.simtools import WHISPER, body, chat

from support import sse

NAME = "whisper-large-v3"


@pytest.fixture
def whisper(start_sim):
    return start_sim("--sim-ttft-ms", "5", "--sim-itl-ms", "1", served_model_name=NAME, model_config=WHISPER)


def wav(seconds: float, rate: int = 8000, tone: int = 1) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(rate)
        w.writeframes(bytes([128 + tone % 100]) * int(seconds * rate))
    return out.getvalue()


def transcribe(server, audio: bytes, filename: str = "call.wav", **fields) -> requests.Response:
    return requests.post(server.url + "/v1/audio/transcriptions", files={"file": (filename, audio)},
                         data={"model": NAME, "language": "en", **fields}, timeout=30)


def text_of(response: requests.Response) -> str:
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"text"}  # vLLM 0.11: the text and nothing else
    return response.json()["text"]


def error_of(response: requests.Response) -> str:
    assert response.status_code == 400, response.text
    return response.json()["error"]["message"]


def test_openai_sdk_transcribes_and_the_text_is_a_function_of_the_audio(whisper):
    client = openai.OpenAI(base_url=whisper.url + "/v1", api_key="unused", max_retries=0)
    first = client.audio.transcriptions.create(model=NAME, file=("a.wav", wav(3)), language="en")
    assert first.text and first.text[0].isupper() and first.text.endswith(".")
    again = client.audio.transcriptions.create(model=NAME, file=("b.wav", wav(3)), language="en")
    assert again.text == first.text
    other = client.audio.transcriptions.create(model=NAME, file=("a.wav", wav(3, tone=7)), language="en")
    assert other.text != first.text
    # response_format=text: vLLM 0.11 still answers JSON, so the SDK hands back that JSON as the text.
    as_text = client.audio.transcriptions.create(model=NAME, file=("a.wav", wav(3)), response_format="text")
    assert json.loads(as_text) == {"text": first.text}


def test_longer_audio_gives_more_words_in_30_second_windows(whisper):
    short = text_of(transcribe(whisper, wav(2)))
    long = text_of(transcribe(whisper, wav(75)))  # read from the WAV header: 75 s, three windows
    assert len(long.split()) > 10 * len(short.split())
    assert "transcription" in whisper.tail() and "75.0 s of audio" in whisper.tail()


def test_audio_without_a_wav_header_is_timed_by_its_size(whisper):
    text_of(transcribe(whisper, os.urandom(160_000), filename="call.mp3"))
    assert "10.0 s of audio (160000 bytes)" in whisper.tail()


def test_file_size_limit_from_the_environment(start_sim):
    server = start_sim(served_model_name=NAME, model_config=WHISPER, env={"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "1"})
    assert error_of(transcribe(server, wav(200))) == "Maximum file size exceeded."  # 1.6 MB
    text_of(transcribe(server, wav(100)))  # 0.8 MB


@pytest.mark.parametrize("fields, message", [
    ({"response_format": "srt"}, "Currently only support response_format `text` or `json`"),
    ({"response_format": "verbose_json"}, "Currently only support response_format `text` or `json`"),
    ({"language": "xx"}, "Unsupported language: 'xx'."),
])
def test_refusals(whisper, fields, message):
    assert error_of(transcribe(whisper, wav(1), **fields)).startswith(message)


def test_form_without_a_file(whisper):
    missing = requests.post(whisper.url + "/v1/audio/transcriptions", data={"model": NAME}, timeout=10)
    assert missing.status_code == 400
    assert (missing.json()["error"]["type"], missing.json()["error"]["param"]) == ("Bad Request", "body.file")
    text_field = requests.post(whisper.url + "/v1/audio/transcriptions", files={"file": (None, "hello")}, timeout=10)
    assert text_field.status_code == 422
    assert text_field.json()["error"]["message"] == "Expected 'file' to be a file-like object, not 'str'."


def test_stream_carries_the_same_text(whisper):
    whole = text_of(transcribe(whisper, wav(40)))
    r = requests.post(whisper.url + "/v1/audio/transcriptions", files={"file": ("a.wav", wav(40))},
                      data={"model": NAME, "language": "en", "stream": "true", "stream_include_usage": "true"},
                      stream=True, timeout=30)
    events = sse(r)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert all(c["object"] == "transcription.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(chunks)


def test_whisper_serves_no_chat_and_a_chat_model_no_transcription(whisper, sim):
    refused = chat(whisper, body())
    assert refused.status_code == 200
    assert refused.json()["error"]["message"] == "The model does not support Chat Completions API"
    other = transcribe(sim, wav(1))
    assert other.status_code == 200
    assert other.json()["error"] == {"message": "The model does not support Transcriptions API",
                                     "type": "BadRequestError", "param": None, "code": 400}


def test_the_transcription_probe_is_a_form_the_server_transcribes(whisper):
    """The functional request for a speech service (verify's cluster_health, an upgrade's canary) is a
    multipart form vLLM accepts."""
    from ansible_collections.dcu.serving.plugins.module_utils import service_request

    api, result = service_request.send_request(whisper.url, "transcription", NAME, "verify-orid", timeout=30)
    assert (api, result.status) == ("transcriptions", 200), result.raw
    assert service_request.answer_problem(api, result.body) is None, result.body
