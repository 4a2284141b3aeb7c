"""A RAG prompt (sources labelled [id], then `Question:`) is answered citing the source sharing the most words
with the question, as a model following the prompt's citation instruction does (sim/citations.py)."""

from __future__ import annotations

import requests


def ask(sim, content: str) -> str:
    answer = requests.post(sim.url + "/v1/chat/completions", timeout=30, json={
        "model": "MiniCPM-V-4.5", "max_tokens": 400, "chat_template_kwargs": {"enable_thinking": False},
        "messages": [{"role": "user", "content": content}]})
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["message"]["content"]


def test_the_answer_cites_the_source_that_matches_the_question(sim):
    prompt = ("Answer from these sources and cite their ids.\n\nSources:\n[c1] Milvus keeps the vectors.\n"
              "[c2] The proxy listens on port 8000 and routes by model.\n\nQuestion: Which port does the proxy use?")
    assert ask(sim, prompt).endswith(" [c2]")
    assert ask(sim, prompt.replace("Which port does the proxy use?", "Where are the vectors kept?")).endswith(" [c1]")


def test_an_ordinary_prompt_cites_nothing(sim):
    assert "[" not in ask(sim, "Say OK.")
