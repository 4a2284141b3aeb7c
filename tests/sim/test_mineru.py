"""MinerU's VLM protocol (sim/mineru.py): the two-step extraction mineru-vl-utils sends to a MinerU2.5 VLM,
answered in its format - the layout from the page's pixels, then each block's content."""

from __future__ import annotations

import base64
import io
import re

import pytest
import requests
from PIL import Image, ImageDraw

NAME = "MinerU2.5-2509-1.2B"
# mineru-vl-utils 1.x's layout parser (mineru_client._layout_re)
LAYOUT_RE = (r"<\|box_start\|>(\d+)\s+(\d+)\s+(\d+)\s+(\d+)<\|box_end\|><\|ref_start\|>(\w+?)<\|ref_end\|>"
             r"(?:(<\|rotate_(?:up|right|down|left)\|>))?(.*?)(?=<\|box_start\|>|$)")


@pytest.fixture
def vlm(start_sim):
    return start_sim("--sim-ttft-ms", "5", "--sim-itl-ms", "1", served_model_name=NAME,
                     model_config={"architectures": ["Qwen2VLForConditionalGeneration"]})


def page() -> bytes:
    """A white page with a tall heading bar and, further down, two lines of 'text' close together."""
    image = Image.new("RGB", (600, 800), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((60, 60, 400, 100), fill="black")
    draw.rectangle((60, 200, 540, 212), fill="black")
    draw.rectangle((60, 218, 500, 230), fill="black")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def ask(server, prompt: str, image: bytes) -> dict:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    answer = requests.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": NAME, "max_tokens": 1024, "temperature": 0.0,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                  {"type": "text", "text": prompt}]}]})
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["message"]


def test_the_layout_names_the_blocks_where_the_ink_is(vlm):
    content = ask(vlm, "\nLayout Detection:", page())["content"]
    blocks = re.findall(LAYOUT_RE, content, re.DOTALL)
    assert [(b[4], b[5]) for b in blocks] == [("title", "<|rotate_up|>"), ("text", "<|rotate_up|>")], content
    title, text = ([int(v) for v in b[:4]] for b in blocks)
    assert title[0] == 100 and title[1] == 75 and title[3] in (125, 126)   # thousandths of 600 x 800
    assert text[1] == 250 and text[2] in (900, 901) and text[3] in (287, 288)
    assert "<think>" not in content


def test_each_block_is_read_as_words_as_long_as_it_is_wide(vlm):
    crop = Image.open(io.BytesIO(page())).crop((60, 200, 540, 230))
    out = io.BytesIO()
    crop.save(out, format="PNG")
    first = ask(vlm, "\nText Recognition:", out.getvalue())["content"]
    assert first.endswith(".") and len(first.split()) == 40  # 480 x 30: 16 x 2.5 words
    assert ask(vlm, "\nText Recognition:", out.getvalue())["content"] == first


def test_other_prompts_get_the_ordinary_simulated_answer(vlm):
    assert "<think>" in ask(vlm, "What is on this page?", page())["content"]
