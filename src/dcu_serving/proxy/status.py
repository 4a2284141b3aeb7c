"""The endpoints the proxy answers from its own state: /health, /v1/models, /__lb_status and /metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .balancer import no_backend
from .responses import error_response, own_headers

if TYPE_CHECKING:
    from .server import Proxy


class StatusEndpoints:
    """Read-only views of the proxy's current settings, balancer and metrics, which a reload replaces."""

    def __init__(self, proxy: Proxy, started: float):
        self._proxy = proxy
        self._started = started  # the `created` of /v1/models

    async def handle_health(self, request: web.BaseRequest) -> web.Response:
        """200 while a backend is healthy and not drained, else 503: what a load balancer in front asks."""
        proxy = self._proxy
        routable = sum(1 for b in proxy.balancer.backends if b.healthy and not b.draining)
        if routable:
            return web.Response(status=200, headers=own_headers(request))
        return error_response(no_backend(proxy.settings.retry_after), own_headers(request)["X-Request-Id"])

    async def handle_models(self, request: web.BaseRequest) -> web.Response:
        """Every served model, as vLLM lists its own (with max_model_len where the configuration states it)."""
        settings = self._proxy.settings
        by_model = self._proxy.balancer.by_model
        cards = []
        for name in settings.models:
            card = {"id": name, "object": "model", "created": int(self._started), "owned_by": "dcu-serving",
                    "root": name, "parent": None}
            group = by_model.get(name)
            max_model_len = (group.max_model_len if group is not None else None) or settings.max_model_len
            if max_model_len:
                card["max_model_len"] = max_model_len
            cards.append(card)
        return web.json_response({"object": "list", "data": cards}, headers=own_headers(request))

    async def handle_lb_status(self, request: web.BaseRequest) -> web.Response:
        """The totals callers read (healthy, total, queue), every backend (with its answers >= 500 since the start:
        `errors`), and the same per served model."""
        balancer = self._proxy.balancer
        backends = balancer.backends
        status = {"healthy": sum(1 for b in backends if b.healthy), "total": len(backends),
                  "queue": balancer.queued, "backends": [self.backend(b) for b in backends],
                  "models": {model: g.status() for g in balancer.groups for model in g.models}}
        mineru = self._proxy.mineru.status()
        if mineru is not None:  # MinerU behind this entrance: its parses here and its own queue
            status["mineru"] = mineru
        return web.json_response(status, headers=own_headers(request))

    def backend(self, b) -> dict:
        """A backend's entry: what the balancer knows, and its answers with status >= 500 since the start."""
        return {**b.status(), "errors": self._proxy.metrics.errors_of(b.name)}

    async def handle_metrics(self, request: web.BaseRequest) -> web.Response:
        headers = own_headers(request)
        headers["Content-Type"] = CONTENT_TYPE_LATEST
        return web.Response(body=generate_latest(self._proxy.metrics.registry), headers=headers)
