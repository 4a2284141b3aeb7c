"""The proxy's bounds against careless or hostile callers, each over a real socket (docs/security.md):

- a connection whose headers never finish, or that sits idle, is closed after `idle_timeout`;
- a large body is refused before it is read (503, Retry-After) when the bodies held at once would pass
  `body_budget`, or when its only pool has no room (queue full); small requests pass meanwhile;
- a stream's caller that stops reading is cut after `write_timeout`, and its card slot is free again.
"""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from proxy.proxytools import body, slow

from support import wait_until


def raw_connection(proxy, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window it offers
    s.connect(("127.0.0.1", proxy.port))
    s.settimeout(10)
    return s


def closed_after(s: socket.socket, limit: float) -> float:
    """Seconds until the proxy closes `s` (reads whatever it sends first)."""
    started = time.monotonic()
    s.settimeout(limit)
    while s.recv(65536):
        pass
    return time.monotonic() - started


def head(length: int, expect: bool = True, path: str = "/v1/chat/completions", orid: str | None = None) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n"
            + ("Expect: 100-continue\r\n" if expect else "") + (f"X-Orid: {orid}\r\n" if orid else "")
            + "\r\n").encode()


def answer(s: socket.socket) -> tuple[int, dict, bytes]:
    """The status line, headers and body (as far as its Content-Length says) of the proxy's next answer."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    top, _, rest = data.partition(b"\r\n\r\n")
    lines = top.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    while len(rest) < int(headers.get("Content-Length", 0)):
        rest += s.recv(65536)
    return int(lines[0].split()[1]), headers, rest


def large_body(size: int) -> bytes:
    """A chat request of `size` bytes (a long text: as large as an image would make it)."""
    raw = json.dumps(body("PAD")).encode()
    return raw.replace(b"PAD", b"x" * (size - len(raw) + 3), 1)


def test_unfinished_headers_and_idle_connections_are_closed(start_sim, start_proxy):
    sim = start_sim(*slow(itl_ms=1, tokens=5))
    proxy = start_proxy([sim.url], idle_timeout=1.0)
    half = raw_connection(proxy)
    half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: applic")
    idle = raw_connection(proxy)
    raw = json.dumps(body()).encode()
    idle.sendall(head(len(raw), expect=False) + raw)
    status, _, _ = answer(idle)
    assert status == 200
    assert 0.5 < closed_after(half, 10) < 3.5  # nginx closes it after client_header_timeout, 60 s by default
    assert closed_after(idle, 10) < 3.5
    assert proxy.chat(body()).status_code == 200


def test_large_bodies_past_the_budget_are_refused_before_they_are_read(start_sim, start_proxy):
    sim = start_sim(*slow(itl_ms=1, tokens=5), "--max-model-len", "1000000",  # room for a long prompt
                    "--sim-prefill-tokens-per-s", "100000000")
    proxy = start_proxy([sim.url], body_budget=1 << 20, max_body_bytes=8 << 20, retry_after=3)
    first = large_body(900_000)
    holding = raw_connection(proxy)
    holding.sendall(head(len(first)))
    assert answer(holding)[0] == 100  # read: the budget holds it
    holding.sendall(first[:300_000])  # ...and the rest later: its 900 kB stay counted meanwhile
    wait_until(lambda: "dcu_proxy_body_bytes_held 900000.0" in proxy_metrics(proxy), 5, what="900 kB held")

    second = raw_connection(proxy)
    second.sendall(head(400_000, orid="ORD-7"))  # would pass the 1 MiB budget: refused before a byte is read
    status, headers, rest = answer(second)
    assert status == 503 and headers["Retry-After"] == "3"
    assert b"body_budget" in rest
    assert proxy.chat(body()).status_code == 200  # a request that came whole with its head is not held up

    holding.sendall(first[300_000:])
    status, _, rest = answer(holding)
    assert status == 200, rest
    wait_until(lambda: "dcu_proxy_body_bytes_held 0.0" in proxy_metrics(proxy), 5, what="the budget given back")
    r = proxy.chat(large_body(400_000).decode())
    assert r.status_code == 200, r.text
    lines = proxy.results()
    assert [line["status"] for line in lines].count(503) == 1
    # its `user` was never read: the order is logged by the X-Orid header the standard client always sends
    assert [line["orid"] for line in lines if line["status"] == 503] == ["ORD-7"]


def test_a_large_body_for_a_full_pool_is_refused_before_it_is_read(start_sim, start_proxy):
    sim = start_sim(*slow(itl_ms=50, tokens=40))
    proxy = start_proxy([sim.url], healthy=1, backend_concurrency=1, queue_size=0)
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(proxy.chat, body(max_tokens=30))
        wait_until(lambda: proxy.lb_status()["backends"][0]["active"] == 1, 10, what="the only slot taken")
        s = raw_connection(proxy)
        s.sendall(head(2_000_000))
        status, headers, rest = answer(s)
        assert status == 503 and "Retry-After" in headers
        assert b"queue is full" in rest
        assert busy.result().status_code == 200


def test_a_stream_whose_caller_stops_reading_frees_its_card(start_sim, start_proxy):
    # ~50 MB of events as fast as the card can: more than the sockets' buffers hold
    sim = start_sim(*slow(itl_ms=0, tokens=200_000), "--max-model-len", "1000000")
    proxy = start_proxy([sim.url], healthy=1, write_timeout=1.0)
    raw = json.dumps(body(user="stalled", stream=True, max_tokens=200_000)).encode()
    s = raw_connection(proxy, rcvbuf=4096)
    s.sendall(head(len(raw), expect=False) + raw)
    status, _, _ = answer(s)
    assert status == 200
    # The caller reads nothing more and keeps its socket open. The proxy's writes stop draining; within the
    # write_timeout (and the watch's second) it closes the connection and the card's slot is free.
    started = time.monotonic()
    wait_until(lambda: proxy.lb_status()["backends"][0]["active"] == 0, 10, what="the card's slot freed")
    assert time.monotonic() - started < 8
    wait_until(lambda: sim_running(sim) == 0, 5, what="the card stopped generating")
    line = proxy.settled_results("stalled")[0]
    assert line["status"] == 499 and "stopped reading" in line["error"]
    assert proxy.chat(body()).status_code == 200
    s.close()


@pytest.mark.parametrize("url", [" http://10.0.0.1/x.png", "FILE:///etc/passwd"])
def test_media_urls_are_checked_over_http(start_sim, start_proxy, url):
    sim = start_sim(*slow(itl_ms=1, tokens=5))
    proxy = start_proxy([sim.url])
    for key in ("image_url", "video_url", "audio_url"):
        r = proxy.chat(body(messages=[{"role": "user", "content": [{"type": key, key: {"url": url}}]}]))
        assert r.status_code == 400 and r.json()["error"]["param"] == f"messages[0].content[0].{key}", r.text
    assert sim_requests(sim) == 0  # none reached the card


def proxy_metrics(proxy) -> str:
    return requests.get(proxy.url + "/metrics", timeout=5).text


def sim_running(sim) -> float:
    text = requests.get(sim.url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def sim_requests(sim) -> float:
    text = requests.get(sim.url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))
