"""Separate the model's <think>…</think> block from its answer, whole or while streaming.

Qwen3-style chat templates open the block in the prompt, so the output may carry only the closing
tag: everything before `</think>` is then thinking.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def split_thinking(text: str) -> tuple[str, str]:
    """(thinking, answer) of a complete output."""
    if CLOSE not in text:
        if OPEN in text:  # cut off while thinking: no answer yet
            before, _, thinking = text.partition(OPEN)
            return thinking.strip(), before.strip()
        return "", text.strip()
    head, _, answer = text.partition(CLOSE)
    before, _, thinking = head.rpartition(OPEN)
    if not _:  # no opening tag: the template opened the block
        thinking, before = head, ""
    return thinking.strip(), (before + answer).strip()


def strip_thinking(text: str) -> str:
    """The answer without the thinking block (also when the opening tag is missing)."""
    return split_thinking(text)[1]


def _partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag (a tag split by chunking)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThinkingSplitter:
    """Feed streamed content pieces; get back the answer pieces that are safe to show now.

    With thinking expected, text before the first tag is held until it is clear whether it is
    thinking (a `</think>` follows, or `<think>` opens) or answer (the stream ends without one).
    """

    def __init__(self, expect_thinking: bool):
        self.state = "undecided" if expect_thinking else "answer"
        self.pending = ""
        self.thinking = ""
        self.answer = ""
        self.after_close = False  # drop the blank lines between </think> and the answer

    def feed(self, piece: str) -> str:
        self.pending += piece
        out = []
        while self.pending:
            if self.state == "answer":
                if self.after_close:
                    self.pending = self.pending.lstrip()
                    self.after_close = not self.pending
                    if not self.pending:
                        break
                keep = _partial_tag_len(self.pending, OPEN)
                if OPEN in self.pending:
                    before, _, self.pending = self.pending.partition(OPEN)
                    out.append(before)
                    self.state = "thinking"
                    continue
                cut = len(self.pending) - keep
                out.append(self.pending[:cut])
                self.pending = self.pending[cut:]
                break
            if self.state == "undecided":
                stripped = self.pending.lstrip()
                if stripped.startswith(OPEN):
                    self.pending = stripped[len(OPEN):]
                    self.state = "thinking"
                    continue
                if stripped and not OPEN.startswith(stripped[: len(OPEN)]):
                    self.state = "thinking-untagged"
                    continue
                break
            # thinking, tagged or not: wait for the closing tag
            if CLOSE in self.pending:
                thought, _, self.pending = self.pending.partition(CLOSE)
                self.thinking += thought
                self.after_close = True
                self.state = "answer"
                continue
            if self.state == "thinking":  # tagged: the text is known to be thinking
                keep = _partial_tag_len(self.pending, CLOSE)
                self.thinking += self.pending[: len(self.pending) - keep]
                self.pending = self.pending[len(self.pending) - keep:]
            break
        text = "".join(out)
        self.answer += text
        return text

    def finish(self) -> str:
        """The stream ended: untagged text that never saw `</think>` was the answer after all."""
        rest = self.pending
        self.pending = ""
        if self.state == "thinking":
            self.thinking += rest
            rest = ""
        self.state = "answer"
        self.answer += rest
        return rest
