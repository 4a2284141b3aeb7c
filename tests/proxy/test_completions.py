"""/v1/completions through the proxy: the same contract, routing, stream handling and results log as chat."""

from __future__ import annotations

from proxy.proxytools import FAST

from support import SERVED_MODEL, sse


def text(**extra) -> dict:
    return {"model": SERVED_MODEL, "user": "20002", "prompt": "Total:", "max_tokens": 4, **extra}


def test_text_completions_carry_the_contract_and_are_logged(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url])
    whole = proxy.post("/v1/completions", text(), headers={"X-Request-Id": "text-1"})
    assert whole.status_code == 200, whole.text
    assert whole.headers["X-Backend"] == f"127.0.0.1:{sim.port}"
    assert whole.json()["id"] == "cmpl-text-1"  # the card names the completion after the proxy's id

    wrong_user = proxy.post("/v1/completions", text(user=20002))
    assert wrong_user.status_code == 400 and wrong_user.json()["error"]["param"] == "user"
    assert wrong_user.headers["X-Backend"] == "dcu-proxy"

    events = sse(proxy.post("/v1/completions", text(stream=True), stream=True))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(e["choices"] for e in chunks), "the usage chunk the proxy asked for reached the caller"
    assert "".join(e["choices"][0]["text"] for e in chunks) == whole.json()["choices"][0]["text"]

    plain, rejected, streamed = proxy.results(count=3)
    # "Total:" is 6 bytes: 2 prompt tokens in the simulator's count
    for line in (plain, streamed):
        assert (line["status"], line["finish_reason"], line["orid"]) == (200, "length", "20002")
        assert (line["prompt_tokens"], line["completion_tokens"]) == (2, 4)
    assert (plain["stream"], streamed["stream"]) == (False, True)
    assert (rejected["status"], rejected["backend"], rejected["orid"]) == (400, None, "20002")
