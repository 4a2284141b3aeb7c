"""Which APIs the proxy passes on, which kinds of model serve each, and where a request's `model` goes.

Each API (`Api`) keeps a dict from model name to the pool (balancer.Group) that serves it, holding only the
models whose kind serves that API: finding a request's pool is one dict lookup on the `model` string already
read from the body. A lookup that misses takes `unrouted`, which says why (no model, an unknown one, a model
of another kind) or, with `contract.model: pass` and a single pool, sends the request there for vLLM to judge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import ProxyError

if TYPE_CHECKING:
    from .balancer import Group

GENERATE = frozenset({"chat", "vision"})
POOLING = frozenset({"rerank", "embedding"})  # vLLM scores with a cross-encoder, or by cosine of embeddings


class Api:
    """One OpenAI-style API: its name in the results log, the kinds of model that serve it, how it is read.

    `chat`: the service contract applies (user, enable_thinking, images); `upload`: multipart/form-data, the
    model a form field. `routes` (model -> pool) is rebuilt when the configuration is (re)loaded.
    """

    __slots__ = ("chat", "kinds", "name", "routes", "title", "upload")

    def __init__(self, name: str, title: str, kinds: frozenset, chat: bool = False, upload: bool = False):
        self.name = name
        self.title = title
        self.kinds = kinds
        self.chat = chat
        self.upload = upload
        self.routes: dict[str, Group] = {}


CHAT = Api("chat", "Chat Completions API", GENERATE, chat=True)
COMPLETIONS = Api("completions", "Completions API", GENERATE, chat=True)
EMBEDDINGS = Api("embeddings", "Embeddings API", frozenset({"embedding"}))
RERANK = Api("rerank", "Rerank API", POOLING)
SCORE = Api("score", "Score API", POOLING)
TRANSCRIPTIONS = Api("transcriptions", "Transcriptions API", frozenset({"transcription"}), upload=True)
SPEECH = Api("speech", "Speech API", frozenset({"speech"}))  # vLLM-Omni text to speech: JSON in, audio out

# POST path -> API; vLLM serves rerank and score under several paths.
APIS: dict[str, Api] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/embeddings": EMBEDDINGS,
    "/v1/rerank": RERANK,
    "/rerank": RERANK,
    "/v2/rerank": RERANK,
    "/v1/score": SCORE,
    "/score": SCORE,
    "/v1/audio/transcriptions": TRANSCRIPTIONS,
    "/v1/audio/speech": SPEECH,
}


def configure(groups: list[Group]):
    """Point every API at the pools whose kind serves it."""
    for api in set(APIS.values()):
        api.routes = {model: g for g in groups if g.kind in api.kinds for model in g.models}


def served_names(groups: list[Group]) -> str:
    """The served models for a message: with their kind when the host serves several pools."""
    if len(groups) == 1:
        return ", ".join(groups[0].models)
    return ", ".join(f"{model} ({g.kind})" for g in groups for model in g.models)


def unrouted(api: Api, model, groups: list[Group], by_model: dict, passing: bool) -> Group:
    """The pool for a request whose `model` is not in `api.routes`, or the error that says why there is none.

    `passing` (contract.model: pass) sends what the proxy cannot place to the only pool, if there is one, and a
    model of another kind to its own pool: vLLM then decides, as it would without the proxy.
    """
    if passing and len(groups) == 1:
        return groups[0]
    fitting = ", ".join(api.routes) or f"none (no model here serves the {api.title})"
    if model is None:
        raise ProxyError(400, f"`model` is required: set it to one of the models serving the {api.title} here: "
                              f"{fitting}.", "model")
    if not isinstance(model, str):
        raise ProxyError(400, f"`model` must be a string, got {type(model).__name__}: set it to one of the models "
                              f"serving the {api.title} here: {fitting}.", "model")
    group = by_model.get(model)
    if group is None:
        raise ProxyError(404, f"The model `{model}` does not exist. Served here: {served_names(groups)}; set "
                              f"`model` to one of them (GET /v1/models lists them).", "model")
    if passing:
        return group
    raise ProxyError(400, f"The model `{model}` ({group.kind}) does not serve the {api.title}. Models here that "
                          f"do: {fitting}. {declare(api, model, group)}", "model")


# The kind a hint names for an API that several kinds serve: the one made for it (chat before vision).
_HINT_ORDER = ("chat", "embedding", "rerank", "transcription", "speech", "vision")


def declare(api: Api, model: str, group: Group) -> str:
    """How the operator tells dcu-proxy that a model is of a kind serving `api`, on its command line or in its file."""
    kinds = [k for k in _HINT_ORDER if k in api.kinds]
    kind, url = kinds[0], group.backends[0].url if group.backends else "http://HOST:PORT"
    return (f"If `{model}` does serve the {api.title} (kind {' or '.join(kinds)}), declare its kind to dcu-proxy: "
            f"`--backend {kind}={url}` on its command line, or in proxy.yml `kind: {kind}` beside a plain `backends` "
            f"list, or its entry `{{url: {url}, models: [{model}], kind: {kind}}}`.")
