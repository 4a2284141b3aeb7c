"""The admin API: drain a card before restarting it, undrain it after, list the backends.

Served on its own loopback listener (admin.listen); with admin.token set, every call needs
`Authorization: Bearer <token>` and the API is also served on the main listener.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from .errors import ProxyError
from .responses import error_response, own_headers

if TYPE_CHECKING:
    from .server import Proxy


class AdminAPI:
    """The /__admin/ handlers. They read the proxy's current settings and balancer, which a reload replaces."""

    def __init__(self, proxy: Proxy):
        self._proxy = proxy

    def routes(self) -> dict:
        """(method, path) -> handler."""
        return {("GET", "/__admin/backends"): self.handle_backends,
                ("POST", "/__admin/drain"): self.handle_drain,
                ("POST", "/__admin/undrain"): self.handle_drain}

    async def handle_backends(self, request: web.BaseRequest) -> web.Response:
        if not self._authorised(request):
            return _unauthorised(request)
        return web.json_response({"backends": [self._proxy.status.backend(b) for b in self._proxy.balancer.backends]},
                                 headers=own_headers(request))

    async def handle_drain(self, request: web.BaseRequest) -> web.Response:
        """POST /__admin/drain and /__admin/undrain: {"backend": URL or host:port}."""
        if not self._authorised(request):
            return _unauthorised(request)
        rid = own_headers(request)["X-Request-Id"]
        try:
            ref = (await request.json())["backend"]
            if not isinstance(ref, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return error_response(ProxyError(400, "Send a JSON body {\"backend\": \"http://HOST:PORT\"} "
                                                  "(the URL or host:port of a backend).", "backend"), rid)
        balancer = self._proxy.balancer
        backend = balancer.find(ref)
        if backend is None:
            known = ", ".join(b.url for b in balancer.backends)
            return error_response(ProxyError(404, f"No backend {ref!r}; known backends: {known}.", "backend"), rid)
        balancer.set_draining(backend, request.path.endswith("/drain"))
        return web.json_response(self._proxy.status.backend(backend), headers=own_headers(request))

    def _authorised(self, request: web.BaseRequest) -> bool:
        token = self._proxy.settings.admin_token
        return token is None or request.headers.get("Authorization") == f"Bearer {token}"


def _unauthorised(request: web.BaseRequest) -> web.Response:
    response = error_response(ProxyError(401, "The admin API needs 'Authorization: Bearer <token>' with the "
                                              "admin.token from the proxy's configuration."),
                              own_headers(request)["X-Request-Id"])
    response.headers["WWW-Authenticate"] = "Bearer"
    return response
