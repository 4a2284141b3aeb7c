"""The lean upstream client against small in-test HTTP servers: reuse, framing, flow control, failures."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from dcu_serving.proxy.upstream import ConnectFailed, ConnectionBroken, DeadlineExceeded, Pool
from support import free_port

BIG = bytes(range(256)) * 8192  # 2 MiB


@pytest.fixture
async def server():
    """An aiohttp app on a free port; `peers` records the client port of each request."""
    peers = []

    async def echo(request):
        peers.append(request.transport.get_extra_info("peername")[1])
        return web.Response(body=await request.read(), headers={"X-Seen": request.headers.get("X-Test", "")})

    async def big(request):
        return web.Response(body=BIG)

    async def chunks(request):
        response = web.StreamResponse()
        await response.prepare(request)
        for i in range(200):
            await response.write(b"%05d" % i * 2000)  # 10 kB each, 2 MB in all
        await response.write_eof()
        return response

    async def dies(request):
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"partial")
        request.transport.abort()
        return response

    async def slow(request):
        await asyncio.sleep(30)
        return web.Response()

    async def close(request):
        return web.Response(text="bye", headers={"Connection": "close"})

    app = web.Application()
    app.add_routes([web.post("/echo", echo), web.get("/big", big), web.get("/chunks", chunks),
                    web.get("/dies", dies), web.get("/slow", slow), web.get("/close", close)])
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield port, peers
    await runner.cleanup()


def later(seconds: float = 5) -> float:
    return asyncio.get_running_loop().time() + seconds


async def get(pool: Pool, path: bytes, deadline: float | None = None):
    return await pool.request(pool.build_head(b"GET", path, b"", None), b"", deadline or later())


async def test_requests_reuse_one_keep_alive_connection(server):
    port, peers = server
    pool = Pool("127.0.0.1", port, 1)
    for i in range(3):
        body = b'{"n": %d}' % i
        conn = await pool.request(pool.build_head(b"POST", b"/echo", b"X-Test: yes\r\n", len(body)), body,
                                  later())
        assert conn.status == 200 and (b"x-seen", b"yes") in [(n.lower(), v) for n, v in conn.headers]
        assert await conn.read() == body
        conn.release()
    assert len(set(peers)) == 1


async def test_a_connection_the_backend_closes_is_not_reused(server):
    port, _ = server
    pool = Pool("127.0.0.1", port, 1)
    conn = await get(pool, b"/close")
    assert await conn.read() == b"bye"
    conn.release()
    assert pool._idle == []


async def test_whole_and_streamed_bodies_survive_flow_control(server):
    port, _ = server
    pool = Pool("127.0.0.1", port, 1)
    conn = await get(pool, b"/big")
    assert await conn.read() == BIG  # larger than the pause threshold: read() must not stall
    conn.release()
    conn = await get(pool, b"/chunks")
    received = bytearray()
    while (chunk := await conn.next_chunk()) is not None:
        received += chunk
        await asyncio.sleep(0.001)  # a slow reader: the backend gets paused and resumed
    assert bytes(received) == b"".join(b"%05d" % i * 2000 for i in range(200))
    conn.release()


async def test_failures_say_whether_the_request_left(server):
    port, _ = server
    with pytest.raises(ConnectFailed):
        await get(Pool("127.0.0.1", free_port(), 1), b"/")
    pool = Pool("127.0.0.1", port, 1)
    conn = await get(pool, b"/dies")
    with pytest.raises(ConnectionBroken):
        await conn.read()
    conn.release()
    with pytest.raises(DeadlineExceeded):
        await get(pool, b"/slow", later(0.2))
    assert pool._idle == []


async def test_an_idle_connection_closed_by_the_backend_is_skipped():
    """A keep-alive connection the backend closed while idle (as a dying card's are) is never written to."""
    writers = []

    async def answer(reader, writer):
        writers.append(writer)
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    pool = Pool("127.0.0.1", server.sockets[0].getsockname()[1], 1)
    conn = await get(pool, b"/")
    assert await conn.read() == b"ok"
    conn.release()
    idle = pool._idle[0]
    idle._transport.pause_reading()  # the event loop does not see the EOF: only the pre-send check can
    writers[0].close()
    await writers[0].wait_closed()
    conn = await get(pool, b"/")
    assert await conn.read() == b"ok"
    conn.release()
    assert len(writers) == 2 and idle.closed
    server.close()
