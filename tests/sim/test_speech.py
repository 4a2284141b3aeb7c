"""/v1/audio/speech for a TTS model served with --omni (vLLM-Omni): real audio bytes a decoder accepts,
its length following the text, and vLLM-Omni's refusals."""

from __future__ import annotations

import io
import wave

import openai
import pytest
import requests
from sim.simtools import body, chat

NAME = "CosyVoice3-0.5B"
TTS = {"architectures": ["CosyVoice3ForConditionalGeneration"], "max_position_embeddings": 4096}


@pytest.fixture
def tts(start_sim):
    return start_sim("--omni", "--sim-ttft-ms", "5", "--sim-itl-ms", "1", served_model_name=NAME, model_config=TTS)


def speak(server, text: str, **fields) -> requests.Response:
    return requests.post(server.url + "/v1/audio/speech", json={"model": NAME, "input": text, **fields}, timeout=30)


def decoded(data: bytes) -> tuple[int, int, int, float]:
    with wave.open(io.BytesIO(data)) as w:
        return w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes() / w.getframerate()


def test_the_openai_sdk_gets_a_wav_that_decodes_and_lasts_as_long_as_the_text(tts):
    client = openai.OpenAI(base_url=tts.url + "/v1", api_key="unused", max_retries=0)
    short = client.audio.speech.create(model=NAME, voice="vivian", input="Hello there.").read()
    channels, width, rate, seconds = decoded(short)
    assert (channels, width, rate) == (1, 2, 24000)
    long = client.audio.speech.create(model=NAME, voice="vivian", input="Hello there. " * 5).read()
    assert decoded(long)[3] == pytest.approx(5 * seconds, rel=0.05)
    assert client.audio.speech.create(model=NAME, voice="vivian", input="Hello there.").read() == short
    fast = client.audio.speech.create(model=NAME, voice="vivian", input="Hello there.", speed=2.0).read()
    assert decoded(fast)[3] == pytest.approx(seconds / 2, rel=0.05)


def test_pcm_is_the_same_samples_without_the_header(tts):
    wav_bytes = speak(tts, "one two three").content
    pcm = speak(tts, "one two three", response_format="pcm")
    assert pcm.headers["Content-Type"] == "audio/pcm"
    with wave.open(io.BytesIO(wav_bytes)) as w:
        assert w.readframes(w.getnframes()) == pcm.content
    answer = speak(tts, "one two three")
    assert answer.headers["Content-Type"] == "audio/wav"
    assert int(answer.headers["x-vllm-omni-output-tokens"]) > 0


@pytest.mark.parametrize("fields, param, text", [
    ({"input": ""}, "input", "Input text cannot be empty"),
    ({"response_format": "mp3"}, "response_format", "ask for wav or pcm"),
    ({"speed": 9}, "body.speed", "less than or equal to 4"),
    ({"model": "nope"}, "model", "The model `nope` does not exist."),
])
def test_refusals_name_the_field(tts, fields, param, text):
    answer = requests.post(tts.url + "/v1/audio/speech", json={"model": NAME, "input": "hi", **fields}, timeout=10)
    assert answer.status_code in (400, 404), answer.text
    error = answer.json()["error"]
    assert error["param"] == param and text in error["message"], error


def test_a_tts_model_serves_no_chat_and_a_chat_model_no_speech(tts, sim):
    refused = chat(tts, body())
    assert refused.json()["error"]["message"] == "The model does not support Chat Completions API"
    other = requests.post(sim.url + "/v1/audio/speech", json={"input": "hi"}, timeout=10)
    assert other.status_code == 200 and other.json()["error"]["message"] == "The model does not support Speech API"


def test_voices_are_listed(tts):
    assert "vivian" in requests.get(tts.url + "/v1/audio/voices", timeout=10).json()["voices"]
