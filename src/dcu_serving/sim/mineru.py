"""MinerU's VLM protocol (mineru-vl-utils' two-step extraction), as the MinerU2.5 VLM answers it.

MinerU's `vlm-http-client` backend sends each page image with the prompt "\\nLayout Detection:" and expects one
line per block, `<|box_start|>x1 y1 x2 y2<|box_end|><|ref_start|>TYPE<|ref_end|><|rotate_up|>`, coordinates
in thousandths of the image; then it crops each block and asks "\\nText Recognition:" (or Table, Formula,
Image Analysis) for its content. A request whose last user message is one image and one of these prompts gets
such an answer, with no thinking block:

- layout: the page's real blocks, found in its pixels (runs of rows holding dark pixels, split at blank gaps
  of more than ~1.2 % of the page), each typed `text` - the first one `title` when it is taller than the
  median of the others, as a heading's large type is;
- text recognition: words as long as the crop is wide, chosen by the crop's pixels (a function of the image and
  --sim-seed). Nothing here reads glyphs: the text is not the page's. A real MinerU2.5 on a card reads it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import random
import statistics

from PIL import Image

LAYOUT = "\nLayout Detection:"
RECOGNITION = ("\nText Recognition:", "\nTable Recognition:", "\nFormula Recognition:", "\nImage Analysis:")
DARK = 160             # a pixel below this grey level is ink
GAP = 0.012            # a blank band taller than this share of the page ends a block
_WORDS = ("driver", "card", "model", "service", "proxy", "vector", "index", "search", "document", "page",
          "port", "memory", "cluster", "request", "answer", "chunk", "parse", "table", "figure", "section")


def task(messages: list) -> tuple[str, bytes] | None:
    """(prompt, image bytes) when the last message is a MinerU VLM request, else None."""
    if not messages or not isinstance(messages[-1], dict) or not isinstance(messages[-1].get("content"), list):
        return None
    texts, images = [], []
    for part in messages[-1]["content"]:
        if not isinstance(part, dict):
            return None
        if part.get("type") == "text":
            texts.append(str(part.get("text", "")))
        elif part.get("type") == "image_url":
            spec = part.get("image_url")
            url = spec.get("url") if isinstance(spec, dict) else spec
            if isinstance(url, str) and url.startswith("data:") and "," in url:
                images.append(base64.b64decode(url.split(",", 1)[1]))
    prompt = "".join(texts)
    if len(images) != 1 or (prompt != LAYOUT and prompt not in RECOGNITION):
        return None
    return prompt, images[0]


def _ink_rows(image: Image.Image) -> list[tuple[int, int, int, int]]:
    """(top, bottom, left, right) of each block of rows holding ink."""
    grey = image.convert("L")
    width, height = grey.size
    pixels = grey.load()
    step = max(1, width // 400)  # a sample of columns is enough to see a line of text
    inked = []
    for y in range(height):
        xs = [x for x in range(0, width, step) if pixels[x, y] < DARK]
        inked.append((min(xs), max(xs)) if xs else None)
    blocks, gap = [], max(2, int(height * GAP))
    start = last = None
    left, right = width, 0
    for y, span in enumerate(inked + [None] * (gap + 1)):
        if span is not None:
            if start is None:
                start, left, right = y, width, 0
            last = y
            left, right = min(left, span[0]), max(right, span[1])
        elif start is not None and y - last > gap:
            blocks.append((start, last, left, right))
            start = None
    return blocks


def layout(image_bytes: bytes) -> str:
    with Image.open(io.BytesIO(image_bytes)) as image:
        width, height = image.size
        blocks = _ink_rows(image)
    if not blocks:
        return ""
    others = statistics.median(bottom - top for top, bottom, _, _ in blocks[1:]) if len(blocks) > 1 else None
    lines = []
    for number, (top, bottom, left, right) in enumerate(blocks):
        kind = "title" if number == 0 and others and bottom - top > 1.2 * others else "text"
        box = (left * 1000 // width, top * 1000 // height, min(999, right * 1000 // width + 1),
               min(999, bottom * 1000 // height + 1))
        lines.append("<|box_start|>{:03d} {:03d} {:03d} {:03d}<|box_end|><|ref_start|>{}<|ref_end|>"
                     "<|rotate_up|>".format(*box, kind))
    return "\n".join(lines)


def recognise(image_bytes: bytes, seed: int) -> str:
    with Image.open(io.BytesIO(image_bytes)) as image:
        width, height = image.size
    rng = random.Random(hashlib.sha256(f"{seed}\0".encode() + image_bytes).digest())
    count = max(2, min(60, round(width / max(1, height) * 2.5)))
    words = [rng.choice(_WORDS) for _ in range(count)]
    return " ".join(words).capitalize() + "."


def answer(prompt: str, image_bytes: bytes, seed: int) -> str:
    return layout(image_bytes) if prompt == LAYOUT else recognise(image_bytes, seed)


def pieces(text: str) -> list[str]:
    """The answer as tokens (a word or a tag at a time): paced like any completion."""
    out, word = [], ""
    for char in text:
        word += char
        if char in " >\n":
            out.append(word)
            word = ""
    return out + ([word] if word else [])
