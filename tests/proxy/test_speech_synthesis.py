"""Speech both ways through one proxy: a TTS model (vLLM-Omni, /v1/audio/speech) beside Whisper
(/v1/audio/transcriptions), each routed by `model`; the synthesised WAV transcribes through the same proxy."""

from __future__ import annotations

import io
import wave

import openai
import pytest
import requests
from sim.simtools import WHISPER

TTS, ASR = "CosyVoice3-0.5B", "whisper-large-v3"
TTS_CONFIG = {"architectures": ["CosyVoice3ForConditionalGeneration"]}


@pytest.fixture
def speech_host(start_sim, start_proxy):
    tts = start_sim("--omni", "--sim-ttft-ms", "5", "--sim-itl-ms", "1", served_model_name=TTS,
                    model_config=TTS_CONFIG)
    asr = start_sim("--sim-ttft-ms", "5", "--sim-itl-ms", "1", served_model_name=ASR, model_config=WHISPER)
    proxy = start_proxy([{"url": tts.url, "models": [TTS], "kind": "speech"},
                         {"url": asr.url, "models": [ASR], "kind": "transcription"}], healthy=2, models=None)
    return proxy, tts, asr


def test_speech_is_synthesised_and_transcribed_through_the_proxy(speech_host):
    proxy, tts, _ = speech_host
    sdk = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
    raw = sdk.audio.speech.with_raw_response.create(model=TTS, voice="vivian", input="The report is due on Friday.")
    assert raw.headers["X-Backend"] == f"127.0.0.1:{tts.port}"
    audio = raw.content
    with wave.open(io.BytesIO(audio)) as w:
        assert (w.getnchannels(), w.getframerate()) == (1, 24000) and w.getnframes() > 24000
    text = sdk.audio.transcriptions.create(model=ASR, file=("speech.wav", audio), language="en").text
    assert text.endswith(".")
    records = proxy.results(2)
    assert [(r["api"], r["model"], r["status"]) for r in records] == [("speech", TTS, 200),
                                                                       ("transcriptions", ASR, 200)]
    assert all(r["error"] is None for r in records), "audio bytes are not an error message"


def test_a_speech_request_to_another_kind_of_model_is_refused_naming_the_tts_models(speech_host):
    proxy, _, _ = speech_host
    answer = requests.post(proxy.url + "/v1/audio/speech", json={"model": ASR, "input": "hi"}, timeout=10)
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert "does not serve the Speech API" in message and TTS in message
