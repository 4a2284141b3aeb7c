"""vLLM's speech-to-text API: POST /v1/audio/transcriptions (multipart/form-data), for Whisper models.

The text is a deterministic function of the audio bytes and --sim-seed. The audio's duration comes from
its WAV header when it has one (stdlib `wave`), else from its size at 128 kbit/s; like vLLM, audio is cut
into 30 s windows, each transcribed as its own request (1500 encoder frames each, then ~2.5 words/s
decoded at the inter-token latency), and the texts are joined.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import math
import random
import time
import uuid
import wave
from typing import Any, Literal, Optional

from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError

from dcu_serving.sim.config import SimConfig
from dcu_serving.sim.engine import Sequence
from dcu_serving.sim.faults import EngineError, Faults
from dcu_serving.sim.generate import DONE, SSE_HEADERS, generate, side_by_side
from dcu_serving.sim.protocol import APIError, error_body, validation_error
from dcu_serving.sim.shared import admit, engine_key, json_response, require

log = logging.getLogger("dcu_serving.sim")

WINDOW_S = 30                 # Whisper's max_audio_clip_s
ENCODER_FRAMES = 1500         # per window (max_source_positions)
WORDS_PER_S = 2.5
COMPRESSED_BYTES_PER_S = 16000  # 128 kbit/s, for audio without a WAV header
HEAD_BYTES = 64 * 1024        # what is kept of an upload to read its header
# vLLM's Whisper ISO639_1_SUPPORTED_LANGS.
LANGUAGES = frozenset((
    "af", "ar", "hy", "az", "be", "bs", "bg", "ca", "zh", "hr", "cs", "da", "nl", "en", "et", "fi", "fr", "gl",
    "de", "el", "he", "hi", "hu", "is", "id", "it", "ja", "kn", "kk", "ko", "lv", "lt", "mk", "ms", "mr", "mi",
    "ne", "no", "fa", "pl", "pt", "ro", "ru", "sr", "sk", "sl", "es", "sw", "sv", "tl", "ta", "th", "tr", "uk",
    "ur", "vi", "cy",
))
_WORDS = ("the", "meeting", "starts", "at", "nine", "and", "the", "report", "is", "due", "on", "friday",
          "please", "send", "the", "invoice", "to", "the", "customer", "before", "the", "end", "of", "the",
          "month", "the", "numbers", "look", "right", "and", "the", "team", "agreed")


class Upload:
    """An uploaded file as the simulator keeps it: its size, its digest and its first bytes."""

    def __init__(self, filename: str | None):
        self.filename, self.size, self.head = filename, 0, b""
        self.digest = hashlib.sha256()

    def add(self, chunk: bytes):
        self.size += len(chunk)
        self.digest.update(chunk)
        if len(self.head) < HEAD_BYTES:
            self.head += chunk[:HEAD_BYTES - len(self.head)]

    def duration(self) -> float:
        """Seconds of audio: the WAV header's frames / rate, else the size at 128 kbit/s."""
        try:
            with wave.open(io.BytesIO(self.head)) as w:
                if w.getframerate() > 0:
                    return w.getnframes() / w.getframerate()
        except (wave.Error, EOFError, OSError):
            pass
        return self.size / COMPRESSED_BYTES_PER_S


class TranscriptionRequest(BaseModel):
    """vLLM's TranscriptionRequest (form fields); `file` is checked before this model sees the form."""

    model_config = ConfigDict(extra="allow")

    file: Any
    model: Optional[str] = None
    language: Optional[str] = None
    prompt: str = ""
    response_format: Literal["json", "text", "srt", "verbose_json", "vtt"] = "json"
    stream: Optional[bool] = False
    stream_include_usage: Optional[bool] = False
    temperature: float = 0.0
    seed: Optional[int] = None


async def _read_form(request: web.Request) -> dict:
    """The form's fields; the file is streamed (vLLM reads it whole, the simulator keeps its head and digest)."""
    form: dict[str, Any] = {}
    if not request.content_type.startswith(("multipart/", "application/x-www-form-urlencoded")):
        return form
    if request.content_type.startswith("application/"):
        return dict(await request.post())
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if part.filename is None:
            form[part.name] = await part.text()
            continue
        upload = Upload(part.filename)
        while chunk := await part.read_chunk():
            upload.add(chunk)
        form[part.name] = upload
    return form


def _parse(form: dict) -> TranscriptionRequest:
    if isinstance(form.get("file"), str):
        # vLLM's validator raises an HTTPException, which its handler answers in the error envelope.
        raise APIError("Expected 'file' to be a file-like object, not 'str'.", 422, "Unprocessable Entity")
    try:
        return TranscriptionRequest.model_validate(form)
    except ValidationError as e:
        raise validation_error(e.errors(include_url=False)) from None


def transcript(upload: Upload, seed: int, duration: float) -> list[list[str]]:
    """The words of each 30 s window: a function of the audio bytes and the seed."""
    rng = random.Random(hashlib.sha256(f"{seed}\0".encode() + upload.digest.digest()).digest())
    windows = []
    for start in range(0, max(1, math.ceil(duration / WINDOW_S))):
        seconds = min(WINDOW_S, duration - start * WINDOW_S)
        count = max(1, round(seconds * WORDS_PER_S))
        pieces, capital = [], True
        for i in range(count):
            word = rng.choice(_WORDS)
            pieces.append((" " if i or start else "") + (word.capitalize() if capital else word))
            capital = i == count - 1 or rng.random() < 0.1
            if capital:
                pieces[-1] += "."
        windows.append(pieces)
    return windows


async def transcriptions(request: web.Request, config: SimConfig, faults: Faults) -> web.StreamResponse:
    """POST /v1/audio/transcriptions."""
    body = _parse(await _read_form(request))
    require(config, {"transcription"}, "Transcriptions API")
    admit(body, config, faults)
    if body.response_format not in ("text", "json"):
        raise APIError("Currently only support response_format `text` or `json`")
    if body.language is None:
        log.warning("Defaulting to language='en'. If you wish to transcribe audio in a different language, pass "
                    "the `language` field in the TranscriptionRequest.")
    elif body.language not in LANGUAGES:
        # vLLM raises a ValueError here (a 400); its exact 0.11 wording is not known, this one says what to send.
        raise APIError(f"Unsupported language: {body.language!r}. Language should be one of: {sorted(LANGUAGES)}")
    upload: Upload = body.file
    if upload.size / 1024**2 > config.max_audio_mb:
        raise APIError("Maximum file size exceeded.")

    duration = upload.duration()
    rid = f"trsc-{uuid.uuid4().hex}"
    seqs = []
    for i, pieces in enumerate(transcript(upload, config.seed, duration)):
        seq = Sequence(f"{rid}-{i}", 4, 0, pieces, "stop", 0, random.Random(i))
        seq.encoder_tokens = ENCODER_FRAMES
        seqs.append(seq)
    engine = request.app[engine_key]
    log.info("transcription %s: %.1f s of audio (%d bytes), %d window(s)", rid, duration, upload.size, len(seqs))
    if body.stream:
        return await _stream(request, engine, seqs, rid, body.model or config.model_name, body.stream_include_usage)
    try:
        await side_by_side(generate(engine, seq) for seq in seqs)
    except EngineError as e:
        raise APIError(str(e), 500, "InternalServerError") from None
    # vLLM 0.11 answers JSON {"text": ...} for response_format text as well.
    return json_response({"text": "".join(piece for seq in seqs for piece in seq.pieces)})


async def _stream(request: web.Request, engine, seqs: list[Sequence], rid: str, model: str,
                  include_usage: bool) -> web.StreamResponse:
    """transcription.chunk events, one per token, the windows one after the other; then usage and [DONE]."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    head = {"id": rid, "object": "transcription.chunk", "created": int(time.time()), "model": model}

    def event(**fields) -> bytes:
        return b"data: " + json.dumps({**head, **fields}, separators=(",", ":")).encode() + b"\n\n"

    async def send(window: int, i: int, text: str, seq: Sequence):
        done = window == len(seqs) - 1 and i == len(seq.pieces) - 1
        choice = {"delta": {"content": text}, "finish_reason": "stop" if done else None, "stop_reason": None}
        await response.write(event(choices=[choice]))

    try:
        for window, seq in enumerate(seqs):
            await generate(engine, seq, functools.partial(send, window))
    except EngineError as e:  # headers and 200 are out: the error travels as an event, like vLLM's
        await response.write(b"data: " + json.dumps(error_body(str(e), "InternalServerError", 500)).encode()
                             + b"\n\n" + DONE)
        await response.write_eof()
        return response
    except ConnectionResetError:
        return response
    if include_usage:
        prompt = sum(seq.prompt_tokens for seq in seqs)
        completion = sum(seq.generated for seq in seqs)
        await response.write(event(choices=[], usage={"prompt_tokens": prompt, "completion_tokens": completion,
                                                      "total_tokens": prompt + completion}))
    await response.write(DONE)
    await response.write_eof()
    return response
