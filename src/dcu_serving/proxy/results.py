"""The results log: one JSON line per API request, written by a thread so the event loop never blocks.

Records carry no prompt text, image data, documents or audio (see FIELDS); an error message that quotes the
request (vLLM's validation errors do) is recorded without the quoted values (answers.error_message). Lines
are written whole with one write() on an O_APPEND descriptor; `reopen()` (on SIGHUP) switches to a fresh
file after logrotate moved the old.

The event loop formats each record as it ends (orjson, under a microsecond) and every FLUSH_INTERVAL hands the
batch to the writer thread as bytes; the thread only calls write(), with the GIL released. Measured
alternatives cost more: waking the thread per request (~0.1 ms of CPU and two context switches per
request), or formatting in the thread (it then contends for the GIL with the event loop, ~10 us per
request). A SIGKILL can lose at most the last FLUSH_INTERVAL of lines; every other way out (SIGTERM, an
exception) writes them all first.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import queue
import threading
import time

from . import fastjson

log = logging.getLogger("dcu_proxy")

# The fields of a line, in order; docs/proxy.md describes each.
FIELDS = ("time", "request_id", "orid", "caller", "api", "model", "backend", "status", "finish_reason", "prompt_tokens",
          "completion_tokens", "ttft_ms", "latency_ms", "queue_ms", "stream", "attempts", "error")

FLUSH_INTERVAL = 0.05  # seconds a record may wait on the event loop before it goes to the writer thread
_STOP = object()


class _Reopen:
    __slots__ = ("path",)

    def __init__(self, path):
        self.path = path


def open_log(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)


class ResultsLog:
    def __init__(self, path: str):
        self.path = path
        self._fd = open_log(path)  # fail at start, with the path, if it cannot be written
        self._loop = asyncio.get_running_loop()
        self._pending: list[bytes] = []
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="results-log", daemon=True)
        self._thread.start()

    def write(self, record: dict):
        """Queue one record (a dict with FIELDS; `time` as a Unix timestamp). Call from the event loop."""
        if not self._pending:
            self._loop.call_later(FLUSH_INTERVAL, self.flush)
        self._pending.append(_line(record))

    def flush(self):
        if self._pending:
            batch, self._pending = self._pending, []
            self._queue.put(b"".join(batch))

    def reopen(self, path: str | None = None):
        self.flush()
        self._queue.put(_Reopen(path or self.path))

    def close(self):
        """Write everything queued, then close."""
        self.flush()
        self._queue.put(_STOP)
        self._thread.join()

    def _run(self):
        while True:
            item = self._queue.get()
            if isinstance(item, bytes):
                self._write(item)
            elif item is _STOP:
                os.close(self._fd)
                return
            else:
                self._switch(item.path)

    def _write(self, data: bytes):
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError as e:
            log.error("results log %s: write failed (%s); %d bytes lost", self.path, e.strerror, len(data))

    def _switch(self, path: str):
        try:
            fd = open_log(path)
        except OSError as e:
            log.error("results log: cannot open %s (%s); still writing to %s", path, e.strerror, self.path)
            return
        os.close(self._fd)
        self._fd, self.path = fd, path


def _line(record: dict) -> bytes:
    """The record as one line of JSON; its `time` becomes ISO 8601 in place."""
    record["time"] = _timestamp(record["time"])
    return fastjson.line(record)


def _timestamp(t: float) -> str:
    """ISO 8601 UTC with milliseconds, exactly as datetime.isoformat(timespec="milliseconds") writes it,
    at a fifth of the cost: the date and time of day are formatted once per second, the rest looked up."""
    second = int(t)
    micros = round((t - second) * 1_000_000)
    if micros >= 1_000_000:
        second, micros = second + 1, micros - 1_000_000
    return _date_and_time(second) + _MILLISECONDS[micros // 1000]


_MILLISECONDS = tuple(f".{ms:03d}+00:00" for ms in range(1000))


@functools.lru_cache(maxsize=4)
def _date_and_time(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
