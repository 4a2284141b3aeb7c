"""The client's contract pieces that need no server: images, thinking, request body, error mapping."""

from __future__ import annotations

import base64
import io
import warnings

import pytest
from PIL import Image

from dcu_serving.client import (
    BackendError,
    BadRequestError,
    Result,
    ServiceTimeout,
    ServiceUnavailable,
    UnsupportedImageError,
    api,
    sniff_mime,
    split_thinking,
    strip_thinking,
    to_data_uri,
)
from dcu_serving.client.api import build_request
from dcu_serving.client.errors import error_from_response
from dcu_serving.client.thinking import ThinkingSplitter


def image_bytes(fmt: str, size=(40, 30), color="red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, fmt)
    return out.getvalue()


def decode_uri(uri: str) -> tuple[str, Image.Image]:
    head, _, b64 = uri.partition(",")
    assert head.startswith("data:") and head.endswith(";base64")
    return head[5:-7], Image.open(io.BytesIO(base64.b64decode(b64)))


@pytest.mark.parametrize("fmt,mime", [
    ("JPEG", "image/jpeg"), ("PNG", "image/png"), ("GIF", "image/gif"), ("WEBP", "image/webp"),
    ("BMP", "image/bmp"), ("TIFF", "image/tiff"),
])
def test_mime_comes_from_the_bytes(fmt, mime):
    assert sniff_mime(image_bytes(fmt)) == mime


def test_png_named_jpg_is_sent_as_png(tmp_path):
    path = tmp_path / "photo.jpg"
    path.write_bytes(image_bytes("PNG"))
    mime, img = decode_uri(to_data_uri(path))
    assert mime == "image/png" and img.format == "PNG"


def test_unknown_format_raises_before_sending(tmp_path):
    path = tmp_path / "notes.jpg"
    path.write_text("this is not an image")
    with pytest.raises(UnsupportedImageError, match=r"notes\.jpg: not a JPEG, PNG"):
        to_data_uri(path)


@pytest.mark.parametrize("size,expected", [((1000, 100), (1000, 334)), ((100, 1000), (334, 1000))])
def test_extreme_aspect_is_padded_with_white_to_3_to_1(size, expected):
    _, img = decode_uri(to_data_uri(image_bytes("PNG", size, "black")))
    assert img.size == expected
    rgb = img.convert("RGB")
    assert rgb.getpixel((0, 0)) == (255, 255, 255)          # padding is white
    assert rgb.getpixel((expected[0] // 2, expected[1] // 2)) == (0, 0, 0)  # the image is centred


def test_padding_keeps_jpeg_and_can_be_switched_off():
    data = image_bytes("JPEG", (900, 90))
    mime, img = decode_uri(to_data_uri(data))
    assert mime == "image/jpeg" and img.size == (900, 300)
    _, img = decode_uri(to_data_uri(data, max_aspect=None))
    assert img.size == (900, 90)


def test_images_within_3_to_1_pass_byte_for_byte():
    data = image_bytes("PNG", (300, 100))
    assert to_data_uri(data) == "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.mark.parametrize("text,thinking,answer", [
    ("<think>count heads</think>\n\nTwo people.", "count heads", "Two people."),
    ("count heads</think>\n\nTwo people.", "count heads", "Two people."),   # template opened the block
    ("Two people.", "", "Two people."),
    ("<think>still thinking when max_tokens ran out", "still thinking when max_tokens ran out", ""),
])
def test_split_and_strip_thinking(text, thinking, answer):
    assert split_thinking(text) == (thinking, answer)
    assert strip_thinking(text) == answer


@pytest.mark.parametrize("pieces", [
    ["<think>", "a", "b</think>", "\n\nThe ", "answer"],
    ["<th", "ink>ab</th", "ink>The answer"],
    ["ab", "</thi", "nk>", "The answer"],                  # no opening tag
])
def test_streamed_thinking_is_held_back_and_split(pieces):
    s = ThinkingSplitter(expect_thinking=True)
    shown = "".join(s.feed(p) for p in pieces) + s.finish()
    assert shown == "The answer" and s.thinking.strip() == "ab"


def test_stream_without_thinking_passes_through_at_once():
    s = ThinkingSplitter(expect_thinking=False)
    assert s.feed("The ") == "The " and s.feed("answer") == "answer"


def test_untagged_stream_that_never_closes_is_the_answer():
    s = ThinkingSplitter(expect_thinking=True)
    assert s.feed("no thinking here") == ""  # undecided until the end
    assert s.finish() == "no thinking here"


def test_request_body_carries_the_contract():
    body = build_request(image_bytes("PNG"), "describe", 12345, model="MiniCPM-V-4.5", max_tokens=384,
                         temperature=0.3, enable_thinking=False, stream=True, max_aspect=3.0)
    assert body["user"] == "12345" and isinstance(body["user"], str)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "enable_thinking" not in body
    assert body["stream_options"] == {"include_usage": True}
    content = body["messages"][0]["content"]
    assert content[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert content[-1] == {"type": "text", "text": "describe"}


def test_a_result_reads_as_a_dict_too_but_not_writes():
    """The design document's client returned a dict: r["answer"], r["finish_reason"], ... work on ours, read-only."""
    r = Result(answer="two people", thinking="count them", finish_reason="length", backend="127.0.0.1:8005",
               request_id="abc", orid="ORD-123", prompt_tokens=30, completion_tokens=64)
    assert (r["answer"], r["finish_reason"], r["backend"], r["completion_tokens"]) == (
        "two people", "length", "127.0.0.1:8005", 64)
    assert r["truncated"] is True and r.get("latency_s") is None and "thinking" in r and "nonsense" not in r
    assert dict(r) == r.to_dict() and list(r) == list(r.to_dict())
    with pytest.raises(KeyError, match=r"Result has no key 'anwser'; its keys are answer, thinking, finish_reason"):
        r["anwser"]
    with pytest.raises(KeyError, match="Result has no key 0"):
        r[0]
    with pytest.raises(TypeError, match=r"Result is read-only: r\['answer'\] cannot be assigned; dict\(r\) is a copy"):
        r["answer"] = "three people"
    with pytest.raises(TypeError, match="read-only"):
        del r["answer"]
    assert r.answer == "two people"


def test_at_most_nine_images():
    with pytest.raises(ValueError, match="1 to 9 images"):
        build_request([image_bytes("PNG")] * 10, "x", "o", model="m", max_tokens=1, temperature=0,
                      enable_thinking=True, stream=False, max_aspect=None)


@pytest.mark.parametrize("status,cls,retryable", [
    (400, BadRequestError, False), (404, BadRequestError, False), (413, BadRequestError, False),
    (502, BackendError, True), (503, ServiceUnavailable, True), (504, ServiceTimeout, False),
])
def test_errors_map_to_what_the_caller_does(status, cls, retryable):
    body = b'{"error": {"message": "m", "type": "BadRequestError", "param": "body.user", "code": %d}}' % status
    err = error_from_response(status, body, {"X-Request-Id": "r1", "X-Backend": "127.0.0.1:8005",
                                             "Retry-After": "2"})
    assert type(err) is cls and err.retryable is retryable
    assert (err.message, err.param, err.request_id, err.backend, err.retry_after) == (
        "m", "body.user", "r1", "127.0.0.1:8005", 2.0)


def test_flat_and_in_stream_error_shapes():
    flat = error_from_response(400, b'{"object": "error", "message": "old style", "code": 400}')
    assert isinstance(flat, BadRequestError) and flat.message == "old style"
    in_stream = error_from_response(200, {"error": {"message": "deadline", "code": 504}})
    assert isinstance(in_stream, ServiceTimeout) and in_stream.status == 504


def test_short_timeout_is_honoured_but_warned_once(monkeypatch):
    monkeypatch.setattr(api, "_warned_short_timeout", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c1 = api.Client("http://127.0.0.1:1", timeout=30)
        api.Client("http://127.0.0.1:1", timeout=20)
    assert c1.timeout == 30
    assert len([w for w in caught if "shorter than" in str(w.message)]) == 1


def test_base_url_defaults_from_environment(monkeypatch):
    monkeypatch.setenv("DCU_SERVING_URL", "http://10.0.0.7:8000/")
    assert api.Client().base_url == "http://10.0.0.7:8000"
