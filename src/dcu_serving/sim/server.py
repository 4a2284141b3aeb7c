"""The HTTP side: vLLM's OpenAI server endpoints on aiohttp, plus /__sim/fault to inject faults.

The API families live in their own modules (generate, pooling, audio); this one holds the service
endpoints, the fault controls and the routes. Every route exists whatever the model: an API the model
does not serve answers as vLLM 0.11 does (see shared.require).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from aiohttp import web

from dcu_serving.sim import VLLM_VERSION, audio, generate, pooling, speech
from dcu_serving.sim.config import SimConfig
from dcu_serving.sim.engine import Engine
from dcu_serving.sim.faults import Fault, FaultError, Faults, crash_process
from dcu_serving.sim.metrics import Metrics
from dcu_serving.sim.protocol import error_body
from dcu_serving.sim.shared import config_key, counted, engine_key, faults_key, load_key, metrics_key
from dcu_serving.sim.shared import json_response as _json

log = logging.getLogger("dcu_serving.sim")

@web.middleware
async def hang_and_fastapi_errors(request: web.Request, handler):
    """`hang` holds every request except /__sim; unknown routes answer like FastAPI ({"detail": ...})."""
    faults = request.app[faults_key]
    if faults.hanging and not request.path.startswith("/__sim/"):
        await faults.wait_while_hanging()
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, 404)
    except web.HTTPMethodNotAllowed:
        return _json({"detail": "Method Not Allowed"}, 405)
    except web.HTTPException:
        raise
    except Exception as e:  # vLLM answers any server-side bug in its error envelope, with the cause logged
        log.exception("unexpected error handling %s %s", request.method, request.path)
        return _json(error_body(f"{type(e).__name__}: {e}", "InternalServerError", 500), 500)


# --- health, models, version, metrics ------------------------------------------------------------

async def health(request: web.Request) -> web.Response:
    return web.Response(status=503 if request.app[faults_key].unhealthy else 200)


async def models(request: web.Request) -> web.Response:
    config = request.app[config_key]
    created = int(time.time())
    cards = [{
        "id": name, "object": "model", "created": created, "owned_by": "vllm",
        "root": str(config.model_path), "parent": None, "max_model_len": config.max_model_len,
        "permission": [{
            "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False,
        }],
    } for name in config.served_model_names]
    return _json({"object": "list", "data": cards})


async def version(request: web.Request) -> web.Response:
    return _json({"version": VLLM_VERSION})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[metrics_key].exposition()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def load(request: web.Request) -> web.Response:
    return _json({"server_load": request.app[load_key][0]})


# --- faults --------------------------------------------------------------------------------------

async def get_faults(request: web.Request) -> web.Response:
    return _json({"faults": request.app[faults_key].describe()})


async def post_fault(request: web.Request) -> web.Response:
    try:
        fault = Fault.from_json(await request.json())
    except (FaultError, ValueError) as e:
        return _json(error_body(str(e), "BadRequestError", 400), 400)
    faults = request.app[faults_key]
    faults.set(fault)
    log.warning("fault injected: %s %s", fault.kind, fault.params)
    response = _json({"faults": faults.describe()})
    if fault.kind == "crash":
        await response.prepare(request)
        await response.write_eof()  # the caller gets its answer before the process goes
        schedule_crash(fault)
    return response


async def delete_fault(request: web.Request) -> web.Response:
    faults = request.app[faults_key]
    faults.clear(request.query.get("kind"))
    log.warning("faults cleared: %s", request.query.get("kind", "all"))
    return _json({"faults": faults.describe()})


def schedule_crash(fault: Fault):
    """The process exits after_s from now (0: as soon as the current response is out)."""
    asyncio.get_running_loop().call_later(fault.params["after_s"], crash_process, "fault crash")


# --- app -----------------------------------------------------------------------------------------

def create_app(config: SimConfig) -> web.Application:
    app = web.Application(middlewares=[hang_and_fastapi_errors], client_max_size=64 * 1024 * 1024)
    faults = Faults()
    metrics_ = Metrics(config.model_name)
    engine = Engine(config, faults, metrics_)
    metrics_.watch(engine)
    app[config_key], app[faults_key], app[metrics_key], app[engine_key] = config, faults, metrics_, engine
    app[load_key] = [0]
    app.router.add_get("/health", health)
    app.router.add_route("*", "/ping", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/load", load)
    app.router.add_post("/v1/chat/completions", counted(generate.chat_completions))
    app.router.add_post("/v1/completions", counted(generate.text_completions))
    app.router.add_post("/v1/embeddings", counted(pooling.embeddings))
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.router.add_post(path, counted(pooling.rerank))
    for path in ("/score", "/v1/score"):
        app.router.add_post(path, counted(pooling.score))
    app.router.add_post("/v1/audio/transcriptions", counted(audio.transcriptions))
    app.router.add_post("/v1/audio/speech", counted(speech.speech))
    app.router.add_get("/v1/audio/voices", speech.voices)
    app.router.add_get("/__sim/fault", get_faults)
    app.router.add_post("/__sim/fault", post_fault)
    app.router.add_delete("/__sim/fault", delete_fault)

    async def start_faults(app):
        for fault in config.faults:
            faults.set(fault)
            log.warning("fault injected at start: %s %s", fault.kind, fault.params)
            if fault.kind == "crash":
                schedule_crash(fault)

    app.on_startup.append(start_faults)
    return app


def serve(config: SimConfig):
    host = config.host or "0.0.0.0"
    log.info("Starting vLLM API server on http://%s:%d", host, config.port)
    # handler_cancellation: a client that hangs up cancels its handler, which frees the sequence's slot.
    web.run_app(create_app(config), host=host, port=config.port, access_log=None,
                print=lambda _: log.info("Application startup complete."),
                handler_cancellation=True, shutdown_timeout=5)
