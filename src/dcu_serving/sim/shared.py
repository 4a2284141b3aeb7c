"""What every API family's handlers share: the app's state, JSON answers, admission checks, /load counting."""

from __future__ import annotations

import json
import logging
import uuid

from aiohttp import web

from dcu_serving.sim.config import SimConfig
from dcu_serving.sim.engine import Engine
from dcu_serving.sim.faults import Faults
from dcu_serving.sim.metrics import Metrics
from dcu_serving.sim.protocol import APIError

log = logging.getLogger("dcu_serving.sim")

config_key = web.AppKey("config", SimConfig)
faults_key = web.AppKey("faults", Faults)
engine_key = web.AppKey("engine", Engine)
metrics_key = web.AppKey("metrics", Metrics)
load_key = web.AppKey("load", list)


def json_response(data, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data, separators=(",", ":")).encode(), status=status,
                        content_type="application/json")


def error_response(err: APIError) -> web.Response:
    return json_response(err.body(), err.http_status)


def counted(generate):
    """An API handler: vLLM's /load counts it while it runs; an APIError becomes its envelope."""
    async def handler(request: web.Request) -> web.StreamResponse:
        app = request.app
        config, faults = app[config_key], app[faults_key]
        load_counter = app[load_key]
        if config.enable_server_load_tracking:
            load_counter[0] += 1
        try:
            return await generate(request, config, faults)
        except APIError as err:
            # Type and parameter only: a validation message can quote the request, prompts stay out of logs.
            log.info("%s refused: %d %s (param %s)", request.path, err.status, err.err_type, err.param)
            return error_response(err)
        finally:
            if config.enable_server_load_tracking:
                load_counter[0] -= 1
    return handler


def require(config: SimConfig, served_by: set[str], api: str):
    """The instance serves this API only for some tasks, as vLLM 0.11 creates its handlers.

    Without the handler vLLM returns its ErrorResponse object from the route itself, which FastAPI sends
    with HTTP 200: the envelope says 400, the status line says 200 (vllm-project/vllm#21704).
    """
    if not served_by & config.tasks:
        raise APIError(f"The model does not support {api}", http_status=200)


def admit(body, config: SimConfig, faults: Faults):
    """The checks every request to the engine passes before its input is looked at."""
    if body.model is not None and body.model not in config.served_model_names:
        raise APIError(f"The model `{body.model}` does not exist.", 404, "NotFoundError", "model")
    ignored = sorted(getattr(body, "model_extra", None) or {})
    if ignored:
        log.warning("The following fields were present in the request but ignored: %s", ignored)
    failure = faults.take_error_status()
    if failure:
        status, kind = failure
        raise APIError(f"Simulated engine failure (dcu-vllm-sim fault {kind!r}).", status,
                       "InternalServerError" if status >= 500 else "BadRequestError")


def request_id(request: web.Request) -> str:
    """vLLM's _base_request_id: the caller's X-Request-Id, else a fresh uuid."""
    return request.headers.get("X-Request-Id") or uuid.uuid4().hex
