"""dcu-mineru-api: MinerU's own API (mineru.cli.fast_api, unchanged) with what a shared service needs in front.

- An upload limit: a request body over --max-upload-mb is refused with 413 and a JSON message naming the limit
  and the fix, before MinerU reads it (by its Content-Length, or while it arrives when it has none). MinerU's
  API has no limit of its own. The refused body is read and dropped first (up to DRAIN_BYTES, DRAIN_SECONDS), as
  nginx's lingering close does: a caller that sends its body whole before it reads (Python's urllib and
  requests) would otherwise have the connection reset under its send and never see the 413. A caller that asked
  `Expect: 100-continue` (curl, for bodies over 1 MiB) gets it at once, its body unsent.
- The VLM it may call: `server_url` of a vlm/hybrid-http-client request must be --vlm-url (dcu-proxy): any
  other address is refused with 400, so a caller cannot make the service connect where it likes. The form is
  read for that check only (Starlette caches it; MinerU reads the same form).

Runs in MinerU's environment (the dcu-serving/mineru image): `python3 -m dcu_serving.mineru.launcher --host ...
--port ... --max-upload-mb 100 --vlm-url http://127.0.0.1:8000`; every other argument goes to mineru-api.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys

PARSE_PATHS = ("/file_parse", "/tasks")
DRAIN_BYTES = 64 * 2**20  # a refused body larger than this is not read: the 413 goes at once
DRAIN_SECONDS = 30.0


def _answer(status: int, message: str, field: str | None = None):
    body = json.dumps({"detail": message, "error": {"message": message, "param": field, "code": status}}).encode()
    return status, body


class Guard:
    """ASGI middleware: the upload limit and the allowed server_url, for MinerU's parse endpoints."""

    def __init__(self, app, max_bytes: int, vlm_url: str):
        self.app, self.max_bytes, self.vlm_url = app, max_bytes, vlm_url.rstrip("/")

    async def _send(self, send, status: int, body: bytes):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _too_large(self, size: int | None):
        got = f"{size} bytes" if size is not None else "more bytes"
        return _answer(413, f"The upload ({got}) is over this MinerU's limit of {self.max_bytes // 2**20} MiB "
                            f"(dcu_mineru_max_upload_mb): split the document, or raise the limit. Nothing was "
                            f"stored.", "files")

    async def _refuse(self, scope, receive, send, answer, size: int | None, read: int = 0, more: bool = True):
        """The 413, after reading and dropping what the caller still sends (bounded), so that it reads it."""
        headers = dict(scope["headers"])
        if more and headers.get(b"expect", b"").lower() != b"100-continue" and (size or 0) <= DRAIN_BYTES:
            with contextlib.suppress(TimeoutError):  # a caller too slow to finish: answered all the same
                await asyncio.wait_for(self._drain(receive, read), DRAIN_SECONDS)
        await self._send(send, *answer)

    @staticmethod
    async def _drain(receive, read: int):
        while read <= DRAIN_BYTES:
            message = await receive()
            read += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body"):
                return

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in PARSE_PATHS:
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and int(length) > self.max_bytes:
            return await self._refuse(scope, receive, send, self._too_large(int(length)), int(length))
        body = bytearray()  # read whole (at most the limit) to check the form before MinerU sees it
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                return await self._refuse(scope, receive, send, self._too_large(None), None, len(body),
                                          bool(message.get("more_body")))
            if not message.get("more_body"):
                break
        problem = await self._server_url_problem(scope, bytes(body))
        if problem:
            return await self._send(send, *problem)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        return await self.app(scope, replay, send)

    async def _server_url_problem(self, scope, body: bytes):
        from starlette.requests import Request

        async def once():
            return {"type": "http.request", "body": body, "more_body": False}

        try:
            form = await Request(scope, once).form(max_files=1000, max_fields=1000)
        except Exception:  # not a form: MinerU answers it as it does
            return None
        url = form.get("server_url")
        await form.close()
        if url and str(url).rstrip("/") != self.vlm_url:
            return _answer(400, f"server_url {url!r} is not this service's VLM: it reads documents through "
                                f"{self.vlm_url} (dcu-proxy) only; send that.", "server_url")
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dcu-mineru-api", description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-upload-mb", type=int, required=True)
    parser.add_argument("--vlm-url", required=True, help="the only server_url allowed (dcu-proxy)")
    args, rest = parser.parse_known_args(argv)
    from mineru.cli import fast_api  # MinerU's own app; imported here, where MinerU is installed

    fast_api.app.add_middleware(Guard, max_bytes=args.max_upload_mb * 2**20, vlm_url=args.vlm_url)
    fast_api.main(rest, standalone_mode=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
