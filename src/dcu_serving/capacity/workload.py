"""The requests of a capacity run: the seeds' workload by default — one document image and a short prompt,
thinking off, temperature 0.3, the caller's orid in `user` — written as an aiperf `single_turn` dataset.

Images are made here (pages with a title, lines of text and a table, each one different, so no cache on the
server side can serve one request from another's work), at the size asked; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

# The standard request of the service's contract (docs/api.md): "describe this picture in detail".
SEEDS_PROMPT = "请详细描述这张图片的内容。"
_FILLER = ["invoice", "total", "amount", "date", "seal", "signature", "customer", "item", "quantity", "price",
           "table", "row", "column", "number", "stamp", "title", "form", "page", "line", "text", "field", "value",
           "account", "address"]


@dataclass
class Workload:
    prompt: str = SEEDS_PROMPT
    prompt_words: int = 0            # > 0: the prompt is padded with this many words (~1 token each)
    image_width: int = 1024
    image_height: int = 768
    images: int = 1                  # images per request (0: text only)
    output_tokens: int = 1024        # max_tokens of each request (the seeds' value)
    thinking: bool = False           # chat_template_kwargs.enable_thinking
    temperature: float = 0.3
    stream: bool = True
    entries: int = 64                # distinct requests, used in shuffled cycles

    def as_dict(self) -> dict:
        return asdict(self)


def page(width: int, height: int, seed: int) -> bytes:
    """A JPEG of a document page: a title, lines of words and a ruled table, different for every seed."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    margin = max(8, width // 20)
    step = max(10, height // 28)
    draw.rectangle((margin, margin, width - margin, margin + step), fill=(30, 30, 30))
    y = margin + 2 * step
    while y < height * 0.55:
        words = " ".join(rng.choice(_FILLER) for _ in range(max(2, width // 60)))
        draw.text((margin, y), f"{words} {rng.randint(10, 99999)}", fill=(20, 20, 20))
        y += step
    rows, cols = 6, 4
    top, cell_h, cell_w = int(height * 0.6), max(6, int(height * 0.3 / rows)), (width - 2 * margin) // cols
    for r in range(rows + 1):
        draw.line((margin, top + r * cell_h, margin + cols * cell_w, top + r * cell_h), fill=(0, 0, 0))
    for c in range(cols + 1):
        draw.line((margin + c * cell_w, top, margin + c * cell_w, top + rows * cell_h), fill=(0, 0, 0))
    for r in range(rows):
        for c in range(cols):
            draw.text((margin + c * cell_w + 4, top + r * cell_h + 2), str(rng.randint(1, 9999)), fill=(0, 0, 90))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=85)
    return out.getvalue()


def prompt_text(workload: Workload, index: int) -> str:
    if workload.prompt_words <= 0:
        return workload.prompt
    rng = random.Random(index)
    return workload.prompt + " " + " ".join(rng.choice(_FILLER) for _ in range(workload.prompt_words))


def write_dataset(workload: Workload, directory: Path, orid_prefix: str) -> Path:
    """images/*.jpg and dataset.jsonl (aiperf's single_turn format) in `directory`; returns the JSONL path."""
    images = directory / "images"
    images.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(workload.entries):
        entry: dict = {"text": prompt_text(workload, i), "output_length": workload.output_tokens,
                       "extra": {"user": f"{orid_prefix}-{i}", "temperature": workload.temperature,
                                 "chat_template_kwargs": {"enable_thinking": workload.thinking}}}
        paths = []
        for k in range(workload.images):
            path = images / f"page-{i:03d}-{k}.jpg"
            path.write_bytes(page(workload.image_width, workload.image_height, seed=i * 16 + k))
            paths.append(str(path))
        if paths:
            entry["images"] = paths
        lines.append(json.dumps(entry, ensure_ascii=False))
    dataset = directory / "dataset.jsonl"
    dataset.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dataset


TOKENIZER_REPO = "dcu-serving/byte-tokenizer"


def byte_tokenizer(hf_cache: Path) -> str:
    """A byte-level tokenizer (one token per byte, no merges) as a repository in the Hugging Face cache
    `hf_cache`; returns its repository id, for aiperf's --tokenizer. aiperf loads a tokenizer even when every
    count comes from the server (--use-server-token-count): its `builtin` one downloads tiktoken's o200k_base
    on first use, a model's own may need its repository's code, and in offline mode it looks a name up in the
    cache only (a plain directory path is refused: see loadgen). Nothing counted here uses it."""
    # GPT-2's printable mapping of the 256 byte values (what a ByteLevel pre-tokenizer emits).
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    vocab = {chars[b]: b for b in range(256)}
    vocab["<|endoftext|>"] = 256
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 256, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    files = {
        "tokenizer.json": json.dumps(tokenizer, ensure_ascii=False),
        "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                             "eos_token": "<|endoftext|>", "model_max_length": 10**7}),
    }
    # The cache's layout (huggingface_hub): refs/main names a snapshot directory holding the files.
    revision = hashlib.sha1("".join(files.values()).encode()).hexdigest()
    repo = hf_cache / ("models--" + TOKENIZER_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (snapshot / name).write_text(text, encoding="utf-8")
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return TOKENIZER_REPO
