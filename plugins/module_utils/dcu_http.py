# -*- coding: utf-8 -*-
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Small HTTP helpers for modules that talk to dcu-proxy and vLLM on the target host.

Requests go through ansible.module_utils.urls (Ansible's TLS, redirect and error handling), which
AnsiballZ ships with the module, so the target needs only its bare python3.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import json
import socket
from urllib.error import HTTPError, URLError

from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url


class HttpResult(object):
    """status (None when no HTTP answer), parsed JSON body (or None), headers, and an error text."""

    def __init__(self, status=None, body=None, headers=None, error=None, raw=b""):
        self.status = status
        self.body = body
        self.headers = headers or {}
        self.error = error
        self.raw = raw

    @property
    def ok(self):
        return self.status == 200


def describe_error(exc):
    """A short, operator-readable cause: 'connection refused', 'timed out', …"""
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, socket.timeout) or "timed out" in str(reason):
        return "timed out"
    err = getattr(reason, "errno", None)
    if err == errno.ECONNREFUSED:
        return "connection refused"
    if err == errno.ECONNRESET:
        return "connection reset"
    if err == errno.EHOSTUNREACH:
        return "host unreachable"
    return str(reason)


def request(url, method="GET", payload=None, timeout=5.0, data=None, content_type=None, headers=None):
    """GET, or POST a JSON `payload` (or raw `data` of `content_type`, e.g. a multipart form); `headers` more headers
    (the gateway's secret of a host behind one)."""
    headers = dict(headers or {}, Accept="application/json")
    if payload is not None:
        data = json.dumps(payload).encode("utf-8")
        headers["Content-Type"] = "application/json"
    elif data is not None:
        headers["Content-Type"] = content_type or "application/octet-stream"
    try:
        # The proxy and the backends are on the host itself: never through an HTTP(S)_PROXY from the
        # environment, never with credentials from a ~/.netrc.
        resp = open_url(url, data=data, headers=headers, method=method, timeout=timeout,
                        use_proxy=False, use_netrc=False)
        status = resp.status
    except HTTPError as e:
        resp, status = e, e.code
    except (URLError, UrlsConnectionError, socket.timeout, OSError) as e:
        return HttpResult(error=describe_error(e))
    try:
        raw = resp.read()
    except (socket.timeout, OSError) as e:
        return HttpResult(status=status, error=describe_error(e))
    finally:
        resp.close()
    body = None
    if raw:
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            body = None
    return HttpResult(status=status, body=body, headers=dict(resp.headers.items()), raw=raw)
