"""A chat request that gives sources labelled `[id] text` and a `Question:` is answered citing the source that
shares the most words with the question, as a model that follows a RAG prompt's citation instruction does.
The rest of the answer is the simulator's usual text; only the citation is a function of the prompt."""

from __future__ import annotations

import re

_SOURCE = re.compile(r"^\[([\w-]+)\]\s+(.*)$", re.MULTILINE)
_QUESTION = re.compile(r"^Question:\s*(.*)$", re.MULTILINE)
_WORD = re.compile(r"\w+")


def cited(messages: list) -> str | None:
    """The id to cite, or None when the last user message is not such a prompt."""
    if not messages or not isinstance(messages[-1], dict):
        return None
    content = messages[-1].get("content")
    if isinstance(content, list):
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    if not isinstance(content, str):
        return None
    sources = _SOURCE.findall(content)
    question = _QUESTION.search(content)
    if not sources or not question:
        return None
    wanted = set(_WORD.findall(question.group(1).lower()))
    best = max(sources, key=lambda s: len(wanted & set(_WORD.findall(s[1].lower()))))
    return best[0]
