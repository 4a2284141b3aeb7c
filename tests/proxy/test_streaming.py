"""Streams pass through chunk by chunk; usage is asked for, logged, and stripped unless the caller asked."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from itertools import pairwise

import aiohttp
from proxy.proxytools import body, slow

from support import free_port

ITL_MS = 40


async def timed_events(url: str, payload: dict) -> list[tuple[float, object]]:
    """(arrival time, payload) of each SSE event, read as the bytes arrive."""
    loop = asyncio.get_running_loop()
    events = []
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/chat/completions",
                                                                json=payload) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        buffer = b""
        async for data in r.content.iter_any():
            now = loop.time()
            buffer += data
            *complete, buffer = buffer.split(b"\n\n")
            for event in complete:
                text = event.decode()[len("data: "):]
                events.append((now, text if text == "[DONE]" else json.loads(text)))
    return events


async def test_chunks_arrive_as_the_card_sends_them(start_sim, start_proxy):
    sim = start_sim(*slow(itl_ms=ITL_MS, tokens=12))
    proxy = start_proxy([sim.url])
    direct = await timed_events(sim.url, body(stream=True))
    proxied = await timed_events(proxy.url, body(stream=True))
    assert [e for _, e in proxied][-1] == "[DONE]"
    assert len(proxied) == len(direct)  # the usage chunk the proxy asked for is gone again
    gaps = sorted(b[0] - a[0] for a, b in pairwise(proxied[1:-1]))
    # each token event arrives on its own, about one ITL after the previous one: nothing is held back
    assert gaps[0] > ITL_MS / 1000 * 0.5, gaps
    assert proxied[1][0] - proxied[0][0] < ITL_MS / 1000 * 2
    content = [e["choices"][0]["delta"].get("content", "") for _, e in proxied[:-1]]
    assert content == [e["choices"][0]["delta"].get("content", "") for _, e in direct[:-1]]


async def test_usage_is_logged_and_stripped_unless_asked_for(start_sim, start_proxy):
    sim = start_sim(*slow(itl_ms=2, tokens=10))
    proxy = start_proxy([sim.url])
    plain = [e for _, e in await timed_events(proxy.url, body(stream=True))]
    assert all(e == "[DONE]" or e["choices"] for e in plain)
    assert not any(isinstance(e, dict) and "usage" in e and e["usage"] for e in plain)
    asked = [e for _, e in await timed_events(proxy.url, body(stream=True,
                                                              stream_options={"include_usage": True}))]
    usage_event = asked[-2]
    assert usage_event["choices"] == [] and usage_event["usage"]["completion_tokens"] > 0
    plain_line, asked_line = proxy.results(count=2)
    assert asked_line["completion_tokens"] == usage_event["usage"]["completion_tokens"]
    assert asked_line["prompt_tokens"] == usage_event["usage"]["prompt_tokens"]
    assert plain_line["finish_reason"] == plain[-2]["choices"][0]["finish_reason"]
    assert asked_line["finish_reason"] == asked[-3]["choices"][0]["finish_reason"]
    for line in (plain_line, asked_line):
        assert line["stream"] is True and line["status"] == 200
        assert line["prompt_tokens"] > 0 and line["completion_tokens"] > 0
        assert line["ttft_ms"] is not None and line["ttft_ms"] <= line["latency_ms"]


async def test_every_stream_is_accounted_whatever_it_asks(start_sim, start_proxy):
    """Usage reaches the results log however the caller words its stream (stream_options null, include_usage
    false, continuous stats without usage, "stream": "true"), and the caller still gets what it asked for: no
    usage event."""
    sim = start_sim(*slow(itl_ms=2, tokens=10))
    proxy = start_proxy([sim.url])
    asks = [{"stream": True, "stream_options": None}, {"stream": True, "stream_options": {"include_usage": False}},
            {"stream": True, "stream_options": {"continuous_usage_stats": True}}, {"stream": "true"}]
    for i, ask in enumerate(asks):
        events = [e for _, e in await timed_events(proxy.url, body(user=f"ask-{i}", **ask))]
        assert events[-1] == "[DONE]" and len(events) > 3
        assert not any(isinstance(e, dict) and e.get("usage") for e in events), ask
    lines = {line["orid"]: line for line in proxy.results(count=len(asks))}
    for i, ask in enumerate(asks):
        line = lines[f"ask-{i}"]
        assert line["stream"] is True and line["status"] == 200, ask
        assert line["completion_tokens"] and line["prompt_tokens"], (ask, line)


def test_a_caller_that_leaves_after_done_is_logged_as_answered(start_proxy):
    """The OpenAI SDK closes its connection once it reads `data: [DONE]`; a card may end its chunked stream a
    moment later. The caller had the whole answer: the results line says 200, not 499."""
    end_stream = threading.Event()
    listener = socket.create_server(("127.0.0.1", free_port()))

    def card():  # a vLLM stand-in whose stream ends (the chunked terminator) only when the test says so
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                request = conn.recv(65536)
                if request.startswith(b"GET"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    continue
                events = (b'data: {"choices":[{"index":0,"delta":{"content":"done"},"finish_reason":"stop"}]}\n\n'
                          b"data: [DONE]\n\n")
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                             b"\r\n%x\r\n%s\r\n" % (len(events), events))
                end_stream.wait(10)
                conn.sendall(b"0\r\n\r\n")

    threading.Thread(target=card, daemon=True).start()
    try:
        proxy = start_proxy([f"http://127.0.0.1:{listener.getsockname()[1]}"], healthy=1)
        payload = json.dumps(body(stream=True, user="leaves-after-done")).encode()
        with socket.create_connection(("127.0.0.1", proxy.port)) as caller:
            caller.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
            received = b""
            while b"data: [DONE]" not in received:
                chunk = caller.recv(65536)
                assert chunk, f"the proxy closed before [DONE]: {received!r}"
                received += chunk
        end_stream.set()  # the caller is gone; now the card's stream ends and the proxy finishes the answer
        [record] = proxy.settled_results("leaves-after-done")
        assert (record["status"], record["finish_reason"]) == (200, "stop"), record
    finally:
        end_stream.set()
        listener.close()
