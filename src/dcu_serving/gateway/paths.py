"""Which of the gateway's paths a caller's key reaches (auth.py), standard library only so it is tested without LiteLLM.

A caller's key reaches the inference paths only: its requests are counted by its limits and named in the hosts'
results logs. Everything else LiteLLM serves - above all `/health`, which sends a completion to every deployment past
routing, drains and limits - takes a probe key (a caller entry with `probe: true`: verify.yml, monitoring).
MinerU's API under /mineru/ (the pass-throughs gateway_config makes when the inventory turns it on) is a caller's
path too: LiteLLM serves nothing else there, and a path no host serves is LiteLLM's 404.
"""

from __future__ import annotations

# The OpenAI-compatible paths dcu-proxy serves behind the gateway, with and without LiteLLM's /v1 prefix.
INFERENCE = frozenset(prefix + path for prefix in ("", "/v1") for path in (
    "/chat/completions", "/completions", "/embeddings", "/rerank", "/audio/transcriptions", "/audio/speech",
    "/models"))
MINERU = "/mineru/"


def mineru(path: str) -> bool:
    """Whether `path` is under MinerU's pass-throughs (/mineru/<host>/...)."""
    return path.startswith(MINERU)


def allowed(path: str, probe: bool) -> bool:
    """Whether a key (a probe key, or a caller's) may call `path`."""
    return probe or path.rstrip("/") in INFERENCE or path.rstrip("/") == "/v2/rerank" or mineru(path)


def refusal(path: str) -> str:
    return (f"this key may call the inference paths only (chat, completions, embeddings, rerank, transcriptions, "
            f"speech, models, MinerU's /mineru/), not {path}; health and the other paths take a probe key "
            f"(ask the gateway's operators)")
