#!/usr/bin/env python3
"""A pager's webhook for the default scenario: a real HTTP server on the node (127.0.0.1:9099) that takes
Alertmanager's notifications (POST /alerts, its JSON version 4) and appends each, with whether it carried the expected
bearer token, as one JSON line to $STATE_DIRECTORY/notifications.jsonl. The tests read that file: what reached the
"person"."""

import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LOG = Path(os.environ.get("STATE_DIRECTORY", "/var/lib/alert-receiver")) / "notifications.jsonl"
TOKEN = os.environ["ALERT_RECEIVER_TOKEN"]
MAX_BODY = 1 << 20


class Receiver(BaseHTTPRequestHandler):
    timeout = 10

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if self.path != "/alerts" or not 0 < length <= MAX_BODY:
            self.send_error(404 if self.path != "/alerts" else 413)
            return
        body = json.loads(self.rfile.read(length))
        authorized = self.headers.get("Authorization") == f"Bearer {TOKEN}"
        with LOG.open("a") as out:
            out.write(json.dumps({"received": time.time(), "authorized": authorized, "notification": body}) + "\n")
        self.send_response(200 if authorized else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format, *args):  # the journal has each request's line
        print(format % args, flush=True)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", 9099), Receiver).serve_forever()
