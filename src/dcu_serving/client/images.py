"""Images as the service wants them: a data URI whose MIME comes from the bytes, padded to 3:1."""

from __future__ import annotations

import base64
import io
import math
import os
from typing import Union

from .errors import UnsupportedImageError

ImageInput = Union[str, "os.PathLike[str]", bytes, bytearray]

MAX_IMAGES = 9
DEFAULT_MAX_ASPECT = 3.0


def sniff_mime(data: bytes) -> str | None:
    """The image type from its magic bytes (never from a file name)."""
    if data[:3] == b"\xff\xd8\xff":
        return "image/jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "image/png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:2] == b"BM":
        return "image/bmp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "image/tiff"
    return None


def read_image(image: ImageInput) -> tuple[bytes, str]:
    """Bytes of a path or bytes input, with a label for error messages."""
    if isinstance(image, (bytes, bytearray)):
        return bytes(image), f"<{len(image)} bytes>"
    path = os.fspath(image)
    with open(path, "rb") as f:
        return f.read(), path


def pad_to_aspect(data: bytes, mime: str, max_aspect: float) -> tuple[bytes, str]:
    """Pad an image wider or taller than max_aspect:1 with white, centred; others pass unchanged.

    Extreme strips degrade the vision encoder's tiling; padding keeps every pixel and fixes the ratio.
    """
    from PIL import Image  # only needed when an image may need padding

    with Image.open(io.BytesIO(data)) as img:
        w, h = img.size
        if max(w, h) <= max_aspect * min(w, h):
            return data, mime
        new_w, new_h = (w, math.ceil(w / max_aspect)) if w > h else (math.ceil(h / max_aspect), h)
        rgb = img.convert("RGBA")
        canvas = Image.new("RGB", (new_w, new_h), "white")
        canvas.paste(rgb, ((new_w - w) // 2, (new_h - h) // 2), rgb)
    out = io.BytesIO()
    if mime == "image/jpeg":
        canvas.save(out, "JPEG", quality=95)
        return out.getvalue(), "image/jpeg"
    canvas.save(out, "PNG")
    return out.getvalue(), "image/png"


def to_data_uri(image: ImageInput, max_aspect: float | None = DEFAULT_MAX_ASPECT) -> str:
    """A data URI for one image; raises UnsupportedImageError before any request is made."""
    data, label = read_image(image)
    mime = sniff_mime(data)
    if mime is None:
        raise UnsupportedImageError(
            f"{label}: not a JPEG, PNG, GIF, WebP, BMP or TIFF image (first bytes {data[:8].hex()})"
        )
    if max_aspect:
        data, mime = pad_to_aspect(data, mime, max_aspect)
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
