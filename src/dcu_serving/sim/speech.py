"""vLLM-Omni's text-to-speech API: POST /v1/audio/speech (JSON in, audio bytes out), GET /v1/audio/voices.

A TTS model (CosyVoice3, Qwen3-TTS) is served by vLLM-Omni (`vllm serve MODEL --omni`); the simulator serves
this API when started with `--omni`. The answer is real audio a decoder accepts: a 24 kHz mono 16-bit WAV (or
the same samples as raw PCM), one short tone per word of the input, so its length follows the text (about 2.5
words a second, divided by `speed`). Generation is paced like a codec-token model: 12 codec tokens per second
of audio (Qwen3-TTS-12Hz), one per inter-token latency, through the engine's queue like any other sequence.

The request follows vLLM-Omni's documented schema (docs/serving/speech_api.md): `input` (required), `model`,
`voice`, `response_format` (wav, mp3, flac, pcm, aac, opus; wav by default), `speed` (0.25-4.0), plus its
extensions, accepted and ignored (`language`, `instructions`, `task_type`, `ref_audio`, `ref_text`, ...). The
simulator encodes wav and pcm only: another format is a 400 that says so. Streaming is not simulated.
"""

from __future__ import annotations

import array
import hashlib
import io
import logging
import math
import random
import sys
import uuid
import wave
from typing import Literal, Optional

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dcu_serving.sim.config import SimConfig
from dcu_serving.sim.engine import Sequence
from dcu_serving.sim.faults import EngineError, Faults
from dcu_serving.sim.generate import generate
from dcu_serving.sim.protocol import APIError, validation_error
from dcu_serving.sim.shared import admit, engine_key, json_response, require

log = logging.getLogger("dcu_serving.sim")

SAMPLE_RATE = 24000           # CosyVoice3 and Qwen3-TTS output 24 kHz
WORDS_PER_S = 2.5
CODEC_TOKENS_PER_S = 12       # Qwen3-TTS-12Hz
VOICES = ("vivian", "ryan", "aiden", "serena")
ENCODED = {"wav": "audio/wav", "pcm": "audio/pcm"}


class SpeechRequest(BaseModel):
    """vLLM-Omni's OpenAICreateSpeechRequest, the fields the simulator reads; the rest is allowed."""

    model_config = ConfigDict(extra="allow")

    input: str
    model: Optional[str] = None
    voice: Optional[str] = None
    response_format: Literal["wav", "pcm", "flac", "mp3", "aac", "opus"] = "wav"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream: Optional[bool] = False


def samples(text: str, seed: int, speed: float) -> array.array:
    """16-bit mono samples: per word a tone (its pitch a function of the word and the seed), then a short pause."""
    out = array.array("h")
    words = text.split() or [text]
    word_s = 1 / WORDS_PER_S / speed
    for word in words:
        rng = random.Random(hashlib.sha256(f"{seed}\0{word}".encode()).digest())
        pitch = rng.uniform(140.0, 320.0)
        tone = int(SAMPLE_RATE * word_s * 0.8)
        fade = max(1, tone // 10)
        for i in range(tone):
            envelope = min(1.0, i / fade, (tone - i) / fade)
            out.append(int(9000 * envelope * math.sin(2 * math.pi * pitch * i / SAMPLE_RATE)))
        out.extend([0] * int(SAMPLE_RATE * word_s * 0.2))
    if sys.byteorder != "little":  # WAV and PCM carry little-endian samples
        out.byteswap()
    return out


def encode(pcm: array.array, response_format: str) -> bytes:
    if response_format == "pcm":
        return pcm.tobytes()
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())
    return buffer.getvalue()


async def speech(request: web.Request, config: SimConfig, faults: Faults) -> web.StreamResponse:
    """POST /v1/audio/speech."""
    try:
        body = SpeechRequest.model_validate(await request.json())
    except ValidationError as e:
        raise validation_error(e.errors(include_url=False)) from None
    except ValueError:
        raise APIError("The request body is not valid JSON: send the speech request as a JSON object.") from None
    require(config, {"speech"}, "Speech API")
    admit(body, config, faults)
    if not body.input.strip():
        raise APIError("Input text cannot be empty", param="input")
    if body.response_format not in ENCODED:
        raise APIError(f"response_format {body.response_format!r} is not encoded by the simulator: ask for "
                       f"{' or '.join(ENCODED)}", param="response_format")
    if body.stream:
        raise APIError("Streaming speech is not simulated: send stream=false", param="stream")
    pcm = samples(body.input, config.seed, body.speed)
    seconds = len(pcm) / SAMPLE_RATE
    rid = f"speech-{uuid.uuid4().hex}"
    tokens = max(1, math.ceil(seconds * CODEC_TOKENS_PER_S))
    seq = Sequence(rid, max(1, len(body.input.encode()) // 4), 0, [""] * tokens, "stop", 0, random.Random(0))
    try:
        await generate(request.app[engine_key], seq)
    except EngineError as e:
        raise APIError(str(e), 500, "InternalServerError") from None
    log.info("speech %s: %.1f s of audio, %d codec tokens", rid, seconds, tokens)
    return web.Response(body=encode(pcm, body.response_format), content_type=ENCODED[body.response_format],
                        headers={"x-vllm-omni-input-tokens": str(seq.prompt_tokens),
                                 "x-vllm-omni-output-tokens": str(tokens),
                                 "x-vllm-omni-total-tokens": str(seq.prompt_tokens + tokens)})


async def voices(request: web.Request) -> web.Response:
    """GET /v1/audio/voices."""
    return json_response({"voices": list(VOICES), "uploaded_voices": []})
