"""A lean HTTP/1.1 keep-alive client for the proxy's hop to the vLLM instances.

Why not aiohttp.ClientSession: measured on this machine it spends 120-210 us of CPU per request on its
own (request objects, yarl, cookie jar, tracing, timers), more than the proxy's whole budget (0.15 ms).
This client writes one pre-built request head per call and parses responses with httptools (llhttp, the
parser uvicorn uses), about 30 us per request. It also knows exactly what aiohttp does not tell apart:
whether a failure happened before the request left (connect failed — safe to retry elsewhere) or after
(the backend may have started work — never retried).

One request at a time per connection; idle connections are reused LIFO and dropped after IDLE_TIMEOUT,
shorter than uvicorn's 5 s keep-alive, so a request is not written into a connection the backend is
closing.
"""

from __future__ import annotations

import asyncio
import select
import time

import httptools

IDLE_TIMEOUT = 4.0
PAUSE_ABOVE = 256 * 1024  # buffered response bytes before reading from the backend pauses


class UpstreamError(Exception):
    """The backend could not be reached or its connection broke."""


class ConnectFailed(UpstreamError):
    """The request never left the proxy: connecting (or the first write) failed. Safe to retry elsewhere."""


class ConnectionBroken(UpstreamError):
    """The connection failed after the request was sent: the backend may have started work."""


class DeadlineExceeded(Exception):
    """The request's deadline passed while waiting for the backend."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to a backend, carrying one request/response at a time.

    After `Pool.request` returns it, `status` and `headers` hold the response head; read the body with
    `read()` or `next_chunk()`, then call `release()` (back to the pool if reusable) — or `abort()`.
    """

    def __init__(self, pool: Pool):
        self._pool = pool
        self._loop = pool.loop
        self._transport = None
        self._fd = -1
        self._parser = httptools.HttpResponseParser(self)
        self._waiter = None
        self._timer = None
        self._write_paused = False
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self):
        self.status = 0
        self.headers = []
        self._headers_done = False
        self._chunks = []
        self._buffered = 0
        self._complete = False
        self._keep_alive = False
        self._error = None
        self._busy = False
        self._paused = False
        self._whole = False  # read() wants the whole body: never pause reading
        self.body_pending = False  # an upload whose body was not all written: never reuse the connection

    # -- asyncio.Protocol --

    def connection_made(self, transport):
        self._transport = transport
        self._fd = transport.get_extra_info("socket").fileno()

    def data_received(self, data):
        if not self._busy:  # a response nobody asked for: the connection is not usable
            self._transport.abort()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(ConnectionBroken(f"invalid HTTP response: {e}"))
            self._transport.abort()

    def pause_writing(self):
        self._write_paused = True

    def resume_writing(self):
        self._write_paused = False
        self._wake()

    def connection_lost(self, exc):
        self.closed = True
        self._write_paused = False
        self._pool.forget(self)
        if self._busy and not self._complete:
            reason = f"{type(exc).__name__}: {exc}" if exc else "closed by the backend"
            self._fail(ConnectionBroken(f"connection to {self._pool.name} broke: {reason}"))

    # -- httptools callbacks --

    def on_header(self, name, value):
        self.headers.append((name, value))

    def on_headers_complete(self):
        self.status = self._parser.get_status_code()
        self._headers_done = True
        self._wake()

    def on_body(self, body):
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > PAUSE_ABOVE and not self._paused and not self._whole:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self):
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()  # only valid inside this callback
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()

    # -- the request --

    def _send(self, head: bytes, body: bytes, deadline: float):
        self._busy = True
        self._timer = self._loop.call_at(deadline, self._expire)
        transport = self._transport
        if len(body) < 65536:
            transport.write(head + body)
        else:
            transport.write(head)
            transport.write(body)
        if transport.is_closing():
            # The very first send failed synchronously (EPIPE/ECONNRESET): nothing reached the backend.
            self._cancel_timer()
            raise ConnectFailed(f"connection to {self._pool.name} was closed before the request was sent")

    # -- a request body sent as it arrives (uploads), after Pool.open --

    @property
    def answered(self) -> bool:
        """The response head has arrived (the backend may answer before it has read the whole body)."""
        return self._headers_done

    def write(self, data: bytes):
        """More of the request body. Raises the connection's error, if it failed."""
        if self._error is not None:
            raise self._error
        self._transport.write(data)

    async def drain(self):
        """Wait while the backend is slower than the caller: the transport's buffer stays bounded."""
        while self._write_paused:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def response(self):
        """Wait for the response head (after the whole body was written)."""
        while not self._headers_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def _wait(self):
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self):
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException):
        if self._error is None:
            self._error = error
        self._wake()

    def _expire(self):
        self._timer = None
        self._fail(DeadlineExceeded())
        self._transport.abort()

    def _cancel_timer(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def read(self) -> bytes:
        """The whole response body."""
        self._whole = True
        if self._paused:
            self._paused = False
            self._transport.resume_reading()
        while not self._complete:
            if self._error is not None:
                raise self._error
            await self._wait()
        return self.body()

    def body(self) -> bytes:
        """The whole body of a `complete` response, without a coroutine: short answers usually arrive with
        their head."""
        chunks, self._chunks = self._chunks, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def next_chunk(self) -> bytes | None:
        """The body bytes received since the last call, as soon as there are any; None at the end."""
        while True:
            if self._chunks:
                chunks, self._chunks = self._chunks, []
                self._buffered = 0
                if self._paused:
                    self._paused = False
                    self._transport.resume_reading()
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if self._error is not None:
                raise self._error
            if self._complete:
                return None
            await self._wait()

    @property
    def complete(self) -> bool:
        return self._complete

    def release(self):
        """Done with the response: keep the connection for the next request if it is reusable."""
        self._cancel_timer()
        if self._complete and self._keep_alive and self._error is None and not self.closed \
                and not self.body_pending:
            self._reset()
            self._pool.put_back(self)
        else:
            self.abort()

    def abort(self):
        """Drop the connection now: the backend sees the client go away and stops generating."""
        self._cancel_timer()
        self._busy = False
        if self._transport is not None and not self.closed:
            self._transport.abort()
        self.closed = True
        self._pool.forget(self)


class Pool:
    """Keep-alive connections to one backend (host, port)."""

    def __init__(self, host: str, port: int, connect_timeout: float):
        self.loop = asyncio.get_running_loop()
        self.host = host
        self.port = port
        self.name = f"{host}:{port}"
        self.connect_timeout = connect_timeout
        self.host_header = f"Host: {self.name}\r\n".encode()
        self._idle: list[UpstreamConnection] = []
        self.retired = False  # the backend left the configuration: no connection goes back to the pool

    async def request(self, head: bytes, body: bytes, deadline: float) -> UpstreamConnection:
        """Send one request; return the connection once the response head has arrived.

        `head` is the request line and headers without Host and the final CRLF (see `build_head`).
        Raises ConnectFailed (nothing sent), ConnectionBroken (sent, then broke) or DeadlineExceeded.
        """
        conn = self._take_idle() or await self._connect(deadline)
        try:
            conn._send(head, body, deadline)
            while not conn._headers_done:
                if conn._error is not None:
                    raise conn._error
                await conn._wait()
        except BaseException:
            conn.abort()
            raise
        return conn

    async def open(self, head: bytes, first: bytes, deadline: float) -> UpstreamConnection:
        """Send a request head and the first part of its body; the rest follows with `write` (an upload).

        Raises ConnectFailed when nothing reached the backend (safe to send elsewhere). Once this returns the
        backend may have started reading: a failure after it is ConnectionBroken, never retried.
        """
        conn = self._take_idle() or await self._connect(deadline)
        try:
            conn._send(head, first, deadline)
        except BaseException:
            conn.abort()
            raise
        return conn

    def build_head(self, method: bytes, path: bytes, headers: bytes, body_length: int | None) -> bytes:
        """The request head: `headers` is pre-encoded 'Name: value\\r\\n' lines (no Host/Content-Length)."""
        length = b"Content-Length: %d\r\n" % body_length if body_length is not None else b""
        return b"%s %s HTTP/1.1\r\n%s%s%s\r\n" % (method, path, self.host_header, headers, length)

    def _take_idle(self) -> UpstreamConnection | None:
        idle = self._idle
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            # An idle connection must have nothing to read: if it has, the backend closed it (EOF already
            # queued, e.g. the process just died) and the event loop has not noticed yet. Writing into it
            # would fail *after* sending, which must not be retried; a fresh connect fails before.
            if not conn.closed and now - conn.idle_since < IDLE_TIMEOUT \
                    and not select.select((conn._fd,), (), (), 0)[0]:
                return conn
            conn.abort()
        return None

    async def _connect(self, deadline: float) -> UpstreamConnection:
        timeout = min(self.connect_timeout, max(deadline - self.loop.time(), 0.001))
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: UpstreamConnection(self), self.host, self.port), timeout)
        except TimeoutError:
            raise ConnectFailed(f"connecting to {self.name} timed out after {timeout:g} s") from None
        except OSError as e:
            raise ConnectFailed(f"cannot connect to {self.name}: {e.strerror or e}") from None
        return conn

    def put_back(self, conn: UpstreamConnection):
        if self.retired:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def forget(self, conn: UpstreamConnection):
        if conn in self._idle:
            self._idle.remove(conn)

    def close(self):
        """Close the idle connections (busy ones close when their request ends)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.abort()
