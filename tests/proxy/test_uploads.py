"""Reading `model` and `user` from a multipart/form-data upload as it arrives (uploads.FormScanner), in-process."""

from __future__ import annotations

import pytest

from dcu_serving.proxy.errors import ProxyError
from dcu_serving.proxy.uploads import FormScanner, boundary_of

AUDIO = b"RIFF" + bytes(range(256)) * 40 + b"\r\n--not-the-boundary\r\n"


def part(name: str, value: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    head = f"--XyZ\r\nContent-Disposition: {disposition}\r\n"
    head += "Content-Type: audio/wav\r\n" if filename else ""
    return head.encode() + b"\r\n" + value + b"\r\n"


def body(*parts: bytes) -> bytes:
    return b"".join(parts) + b"--XyZ--\r\n"


def scan(data: bytes, step: int | None = None) -> tuple[FormScanner, int]:
    """Feed the body's growing prefix `step` bytes at a time; (scanner, bytes it needed)."""
    scanner = FormScanner(b"XyZ")
    step = step or len(data)
    for end in range(step, len(data) + step, step):
        if scanner.feed(data[:end]):
            return scanner, min(end, len(data))
    scanner.finish()
    return scanner, len(data)


FIELDS_FIRST = body(part("model", b"whisper-large-v3"), part("language", b"en"), part("user", b"ORD-7"),
                    part("file", AUDIO, "a.wav"), part("temperature", b"0"))
FILE_FIRST = body(part("file", AUDIO, "a.wav"), part("model", b"whisper-large-v3"), part("user", b"late"))


@pytest.mark.parametrize("step", [None, 1, 7, 64])
def test_fields_before_the_file_are_read_and_the_file_is_not(step):
    scanner, needed = scan(FIELDS_FIRST, step)
    assert scanner.fields == {"model": "whisper-large-v3", "user": "ORD-7"}
    if step:  # fed piece by piece, it stopped where the file's bytes begin
        assert needed < FIELDS_FIRST.index(AUDIO) + step


@pytest.mark.parametrize("step", [None, 1, 13])
def test_a_model_after_the_file_is_found_by_reading_through_it(step):
    scanner, needed = scan(FILE_FIRST, step)
    assert scanner.fields == {"model": "whisper-large-v3"}  # a `user` after the file is not the orid
    assert needed >= FILE_FIRST.index(b"whisper")


def test_a_form_without_a_model_ends_with_none():
    scanner, _ = scan(body(part("language", b"en"), part("file", AUDIO, "a.wav")))
    assert scanner.done and scanner.fields == {}


def test_malformed_forms_are_a_400():
    for data in (b"no boundary at all", b"--XyZ\r\n" + b"x" * 20_000, b"--XyZjunk"):
        with pytest.raises(ProxyError) as e:
            scan(data)
        assert e.value.status == 400 and "cannot be read" in e.value.message


def test_the_boundary_comes_from_the_content_type():
    assert boundary_of('multipart/form-data; boundary="a b"') == b"a b"
    assert boundary_of("multipart/form-data; charset=utf-8; boundary=----x") == b"----x"
    for wrong in ("application/json", "multipart/form-data", "multipart/mixed; boundary=x"):
        with pytest.raises(ProxyError) as e:
            boundary_of(wrong)
        assert e.value.status == 400 and "multipart/form-data with a boundary" in e.value.message
