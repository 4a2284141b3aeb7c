"""The fields the proxy needs from a multipart/form-data upload, read as its bytes arrive.

A transcription names its model in a form field, and the audio may come before or after it. `FormScanner`
reads the parts as the body comes in and stops as soon as it knows enough: the model (and the caller's
`user`) from the fields before the first file part, or, when the model comes after the file, from the first
field named `model` after it. The bytes read so far are kept by the relay and forwarded ahead of the rest, so
a file that follows its fields (the OpenAI SDK, requests and httpx put fields first) is not buffered at all.
"""

from __future__ import annotations

from aiohttp.helpers import parse_mimetype

from .errors import ProxyError

MAX_PART_HEAD = 16 * 1024  # the headers of one part; a browser's or an SDK's are a few hundred bytes
MAX_FIELD = 4096  # a field kept as text (model, user); longer values are not names or order ids


def boundary_of(content_type: str) -> bytes:
    """The multipart boundary of a Content-Type header, or a 400 that says what is wrong."""
    mime = parse_mimetype(content_type)
    boundary = mime.parameters.get("boundary", "")
    if mime.type != "multipart" or mime.subtype != "form-data" or not boundary or len(boundary) > 70:
        raise ProxyError(400, f"Content-Type must be multipart/form-data with a boundary (1-70 characters), got "
                              f"{content_type!r}: send the audio as a form part `file` and the model as a field "
                              f"`model`, as the OpenAI SDK does.")
    try:
        return boundary.encode("ascii")
    except UnicodeEncodeError:
        raise ProxyError(400, "The multipart boundary must be ASCII.") from None


class FormScanner:
    """Finds `model` and `user` in a multipart/form-data body, fed the body's growing prefix.

    `feed(prefix)` scans what it has not scanned yet and returns True once done: the model is known and the
    first file part has begun (or the body ended). `fields` then holds `model` and, if it came before the
    first file part, `user`. A malformed body raises ProxyError 400.
    """

    __slots__ = ("_delimiter", "_name", "_pos", "_start", "_state", "_text", "done", "fields", "file_seen")

    def __init__(self, boundary: bytes):
        self._delimiter = b"--" + boundary
        self._pos = 0  # where the next search starts
        self._start = 0  # where the current part's headers or content start
        self._state = "preamble"
        self._name: str | None = None
        self._text = False  # the current part is a field (no filename), not a file
        self.fields: dict[str, str] = {}
        self.file_seen = False
        self.done = False

    def feed(self, buf: bytes | bytearray) -> bool:
        while not self.done:
            if self._state == "preamble":
                at = buf.find(self._delimiter, self._pos)
                if at < 0:
                    self._pos = max(0, len(buf) - len(self._delimiter))
                    return False
                if not self._after_delimiter(buf, at + len(self._delimiter)):
                    return False
            elif self._state == "headers":
                end = buf.find(b"\r\n\r\n", self._pos)
                if end < 0:
                    if len(buf) - self._start > MAX_PART_HEAD:
                        raise _malformed("a part's headers are longer than 16 KiB")
                    self._pos = max(self._start, len(buf) - 3)
                    return False
                self._part_head(bytes(buf[self._start:end]))
                self._start = self._pos = end + 4
                self._state = "content"
                if not self._text:
                    self.file_seen = True
                    if "model" in self.fields:
                        self.done = True
            else:  # content: up to the next delimiter, which follows a CRLF
                marker = b"\r\n" + self._delimiter
                at = buf.find(marker, self._pos)
                if at < 0:
                    self._pos = max(self._start, len(buf) - len(marker))
                    return False
                if self._text and self._name is not None and at - self._start <= MAX_FIELD \
                        and (self._name == "model" or (self._name == "user" and not self.file_seen)) \
                        and self._name not in self.fields:
                    self.fields[self._name] = bytes(buf[self._start:at]).decode("utf-8", "replace")
                if not self._after_delimiter(buf, at + len(marker)):
                    return False
                if self.file_seen and "model" in self.fields:
                    self.done = True
        return True

    def finish(self):
        """The body ended: whatever was found is all there is."""
        if self._state == "preamble":
            raise _malformed("no part starts with the boundary the Content-Type names")
        self.done = True

    def _after_delimiter(self, buf, at: int) -> bool:
        """After a delimiter: CRLF and the next part's headers, or `--` and the end. False: need more bytes."""
        tail = buf[at:at + 2]
        if len(tail) < 2:
            self._pos = at - len(self._delimiter) - (2 if self._state == "content" else 0)
            return False
        if tail == b"--":
            self.done = True
            return True
        if tail != b"\r\n":
            raise _malformed("a boundary is not followed by CRLF")
        self._start = self._pos = at + 2
        self._state = "headers"
        return True

    def _part_head(self, head: bytes):
        self._name, self._text = None, True
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() != b"content-disposition":
                continue
            for param in value.split(b";")[1:]:
                key, _, raw = param.strip().partition(b"=")
                key = key.strip().lower()
                raw = raw.strip()
                if raw[:1] == b'"' and raw[-1:] == b'"':
                    raw = raw[1:-1]
                if key == b"name":
                    self._name = raw.decode("utf-8", "replace")
                elif key in (b"filename", b"filename*"):
                    self._text = False


def _malformed(why: str) -> ProxyError:
    return ProxyError(400, f"The multipart/form-data body cannot be read: {why}. Send it as the OpenAI SDK, "
                           f"requests or curl -F do.")
