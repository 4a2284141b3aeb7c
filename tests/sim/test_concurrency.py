"""Admission like vLLM: --max-num-seqs sequences at once, a FIFO queue, disconnects free slots."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import requests
from sim.simtools import body, metric

from support import FAST_SIM, wait_until

# Slow enough to watch: ~40 tokens at 25 ms = 1 s per request.
SLOW = (*FAST_SIM, "--sim-itl-ms", "25", "--sim-answer-tokens", "40", "--max-num-seqs", "2")


def gauges(server) -> tuple[float, float]:
    return metric(server, "vllm:num_requests_running"), metric(server, "vllm:num_requests_waiting")


async def first_token_order(server, n: int) -> list[int]:
    """Start n streams in order; return their indexes in the order their first token arrived."""
    order: list[int] = []

    async def one(session, i):
        payload = body(text=f"request {i}", stream=True, chat_template_kwargs={"enable_thinking": False})
        async with session.post(server.url + "/v1/chat/completions", json=payload) as r:
            assert r.status == 200
            async for line in r.content:
                if line.startswith(b"data: {"):
                    order.append(i)
                    break
            await r.read()

    async with aiohttp.ClientSession() as session:
        tasks = []
        for i in range(n):
            tasks.append(asyncio.create_task(one(session, i)))
            await asyncio.to_thread(wait_until, lambda i=i: sum(gauges(server)) == i + 1,
                                    5, what=f"request {i} admitted or queued")
        # With 2 slots, 2 run and the rest wait — and the waiting queue shows in the metrics.
        assert gauges(server) == (2, n - 2)
        await asyncio.gather(*tasks)
    return order


async def test_max_num_seqs_and_fifo_queue_visible_in_metrics(start_sim):
    server = start_sim(*SLOW)
    order = await first_token_order(server, 5)
    assert sorted(order[:2]) == [0, 1] and order[2:] == [2, 3, 4]  # first come, first served
    assert gauges(server) == (0, 0)
    assert metric(server, "vllm:request_success_total", finished_reason="stop") == 5
    assert metric(server, "vllm:request_queue_time_seconds_sum") > 1.0


async def test_client_disconnect_aborts_and_frees_the_slot(start_sim):
    server = start_sim(*SLOW, "--max-num-seqs", "1")
    payload = body(stream=True)
    async with aiohttp.ClientSession() as session:
        response = await session.post(server.url + "/v1/chat/completions", json=payload)
        assert (await response.content.readline()).startswith(b"data: ")
        queued = asyncio.create_task(session.post(server.url + "/v1/chat/completions",
                                                  json=body(max_tokens=3)))
        await asyncio.to_thread(wait_until, lambda: gauges(server) == (1, 1), 5, what="second request queued")
        response.close()  # hang up mid-stream
        reply = await asyncio.wait_for(queued, 5)
        assert reply.status == 200
        assert (await reply.json())["usage"]["completion_tokens"] == 3
    assert metric(server, "vllm:request_success_total", finished_reason="abort") == 1
    assert gauges(server) == (0, 0)


def test_disconnect_while_queued_leaves_the_queue(start_sim):
    server = start_sim(*SLOW, "--max-num-seqs", "1")
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s")
    payload = json.dumps(body()).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as running:
        running.sendall(request % (len(payload), payload))
        wait_until(lambda: gauges(server) == (1, 0), 5, what="first request running")
        with socket.create_connection(("127.0.0.1", server.port)) as waiting:
            waiting.sendall(request % (len(payload), payload))
            wait_until(lambda: gauges(server) == (1, 1), 5, what="second request waiting")
        wait_until(lambda: gauges(server) == (1, 0), 5, what="queue empty after the waiting client left")
    wait_until(lambda: gauges(server) == (0, 0), 5, what="slot free after the running client left")
    assert metric(server, "vllm:request_success_total", finished_reason="abort") == 2


async def test_load_endpoint_counts_requests_in_flight(start_sim):
    server = start_sim(*SLOW, "--enable-server-load-tracking")
    load = lambda: requests.get(server.url + "/load", timeout=5).json()["server_load"]  # noqa: E731
    assert load() == 0
    async with aiohttp.ClientSession() as session:
        pending = [asyncio.create_task(session.post(server.url + "/v1/chat/completions", json=body()))
                   for _ in range(3)]
        await asyncio.to_thread(wait_until, lambda: load() == 3, 5, what="3 requests in flight")
        for response in await asyncio.gather(*pending):
            assert response.status == 200
    assert load() == 0
