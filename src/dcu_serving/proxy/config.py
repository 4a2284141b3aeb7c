"""dcu-proxy configuration: the YAML schema, its defaults and its validation.

One table (`SCHEMA`) names every key, its default and how it is checked; docs/proxy.md mirrors it.
A bad file raises ConfigError naming the key and the reason, and the command exits non-zero.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

import yaml

DEFAULT_PATH = "/etc/dcu-serving/proxy.yml"
ADMIN_TOKEN_ENV = "DCU_PROXY_ADMIN_TOKEN"


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key and says what to write instead."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.key = key


# -- value checkers: each takes (key, value) and returns the normalised value or raises ConfigError --

def _int(low: int, high: int | None = None) -> Callable[[str, Any], int]:
    def check(key, value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"must be an integer, got {value!r}")
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise ConfigError(key, f"must be {bound}, got {value}")
        return value
    return check


def _seconds(low: float = 0.0) -> Callable[[str, Any], float]:
    def check(key, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"must be a number of seconds, got {value!r}")
        if value <= low:
            raise ConfigError(key, f"must be > {low:g} seconds, got {value}")
        return float(value)
    return check


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def check(key, value):
        if value not in choices:
            raise ConfigError(key, f"must be one of {', '.join(choices)}; got {value!r}")
        return value
    return check


def _optional(inner: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    def check(key, value):
        return None if value is None else inner(key, value)
    return check


def _text(key, value):
    if not isinstance(value, str) or not value:
        raise ConfigError(key, f"must be a non-empty string, got {value!r}")
    return value


def parse_listen(key: str, value: Any) -> tuple[str, int]:
    """'HOST:PORT' or '[v6]:PORT' -> (host, port)."""
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(key, f"must be HOST:PORT such as 0.0.0.0:8000, got {value!r}")
    host, _, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(key, f"must be HOST:PORT with a port 1-65535, got {value!r}")
    return host, int(port)


def _listen(key, value):
    parse_listen(key, value)
    return value


def _backend_url(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(key, f"must be a URL such as http://127.0.0.1:8002, got {value!r}")
    parts = urlsplit(value)
    if parts.scheme != "http":
        raise ConfigError(key, f"must be an http:// URL (vLLM listens on plain HTTP on the host), got {value!r}")
    if not parts.hostname or parts.port is None:
        raise ConfigError(key, f"must name host and port, e.g. http://127.0.0.1:8002, got {value!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(key, f"must be http://HOST:PORT without a path, got {value!r}")
    return f"http://{parts.netloc}"


def _list_of(inner: Callable[[str, Any], Any], what: str) -> Callable[[str, Any], list]:
    def check(key, value):
        if not isinstance(value, list) or not value:
            raise ConfigError(key, f"must be a non-empty list of {what}, got {value!r}")
        out = [inner(f"{key}[{i}]", v) for i, v in enumerate(value)]
        seen = set()
        for i, v in enumerate(out):
            if v in seen:
                raise ConfigError(f"{key}[{i}]", f"{v!r} is listed twice")
            seen.add(v)
        return out
    return check


def _path(key, value):
    if not isinstance(value, str) or not value.startswith("/"):
        raise ConfigError(key, f"must be an absolute file path, got {value!r}")
    return value


# -- the schema: key -> (default, checker) or a nested dict for a section --

REQUIRED = object()  # marker: no default, the key must be given (file or command line)

CONTRACT_MODES = {
    # rule -> (strict value, relaxed value)
    "user": ("reject", "coerce"),
    "enable_thinking": ("reject", "move"),
    "image_urls": ("reject", "allow"),
    "model": ("reject", "pass"),
    "max_images": (9, 0),
}

SCHEMA: dict[str, Any] = {
    "listen": ("0.0.0.0:8000", _listen),
    "backends": (REQUIRED, _list_of(_backend_url, "backend URLs")),
    "models": (REQUIRED, _list_of(_text, "served model names")),
    "max_model_len": (None, _optional(_int(1))),
    "backend_concurrency": (4, _int(1, 1024)),
    "queue_size": (1000, _int(0, 100_000)),
    "request_timeout": (300.0, _seconds()),
    "connect_timeout": (3.0, _seconds()),
    "max_body_bytes": (64 * 1024 * 1024, _int(1024)),
    "retry_after": (1, _int(1, 3600)),
    "shutdown_grace": (30.0, _seconds()),
    "results_log": (None, _optional(_path)),
    "log_level": ("info", _choice("debug", "info", "warning", "error")),
    "health": {
        "path": ("/health", _text),
        "interval": (5.0, _seconds()),
        "timeout": (2.0, _seconds()),
    },
    "contract": {
        "mode": ("strict", _choice("strict", "relaxed")),
        "user": (None, _optional(_choice("reject", "coerce"))),
        "enable_thinking": (None, _optional(_choice("reject", "move"))),
        "image_urls": (None, _optional(_choice("reject", "allow"))),
        "model": (None, _optional(_choice("reject", "pass"))),
        "max_images": (None, _optional(_int(0))),
    },
    "admin": {
        "listen": ("127.0.0.1:8001", _optional(_listen)),
        "token": (None, _optional(_text)),
    },
}


@dataclass(frozen=True)
class Contract:
    user: str = "reject"
    enable_thinking: str = "reject"
    image_urls: str = "reject"
    model: str = "reject"
    max_images: int = 9


@dataclass(frozen=True)
class Config:
    backends: tuple
    models: tuple
    listen: str = "0.0.0.0:8000"
    max_model_len: int | None = None
    backend_concurrency: int = 4
    queue_size: int = 1000
    request_timeout: float = 300.0
    connect_timeout: float = 3.0
    max_body_bytes: int = 64 * 1024 * 1024
    retry_after: int = 1
    shutdown_grace: float = 30.0
    results_log: str | None = None
    log_level: str = "info"
    health_path: str = "/health"
    health_interval: float = 5.0
    health_timeout: float = 2.0
    contract: Contract = field(default_factory=Contract)
    admin_listen: str | None = "127.0.0.1:8001"
    admin_token: str | None = None
    source: str | None = None  # the file it came from, for messages

    @property
    def listen_addr(self) -> tuple[str, int]:
        return parse_listen("listen", self.listen)

    @property
    def admin_addr(self) -> tuple[str, int] | None:
        return parse_listen("admin.listen", self.admin_listen) if self.admin_listen else None


def _apply(schema: dict, data: Any, prefix: str = "") -> dict:
    """Check `data` against `schema`: unknown keys rejected by name, defaults filled in."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(prefix.rstrip(".") or "(top level)", f"must be a mapping, got {type(data).__name__}")
    for key in data:
        if key not in schema:
            known = ", ".join(sorted(schema))
            raise ConfigError(f"{prefix}{key}", f"unknown key (known keys here: {known})")
    out = {}
    for key, spec in schema.items():
        name = f"{prefix}{key}"
        if isinstance(spec, dict):
            out[key] = _apply(spec, data.get(key), f"{name}.")
            continue
        default, check = spec
        if key not in data:
            if default is REQUIRED:
                raise ConfigError(name, "is required")
            out[key] = default
        else:
            out[key] = check(name, data[key])
    return out


def build(data: Any, source: str | None = None) -> Config:
    """Validate a parsed YAML document (plus command-line overrides already merged) into a Config."""
    v = _apply(SCHEMA, data)
    c = v["contract"]
    strict = c["mode"] == "strict"
    rules = {rule: c[rule] if c[rule] is not None else (s if strict else r)
             for rule, (s, r) in CONTRACT_MODES.items()}
    admin = v["admin"]
    token = os.environ.get(ADMIN_TOKEN_ENV) or admin["token"]
    if admin["listen"] and not token:
        host, _ = parse_listen("admin.listen", admin["listen"])
        if not _is_loopback(host):
            raise ConfigError("admin.listen", f"{host} is not a loopback address; the admin API without a "
                              f"token may listen only on 127.0.0.1 or ::1 — set admin.token or use 127.0.0.1")
    if v["health"]["timeout"] > v["health"]["interval"]:
        raise ConfigError("health.timeout", f"must not exceed health.interval ({v['health']['interval']:g} s)")
    if not v["health"]["path"].startswith("/"):
        raise ConfigError("health.path", f"must start with '/', got {v['health']['path']!r}")
    return Config(
        listen=v["listen"], backends=tuple(v["backends"]), models=tuple(v["models"]),
        max_model_len=v["max_model_len"], backend_concurrency=v["backend_concurrency"],
        queue_size=v["queue_size"], request_timeout=v["request_timeout"],
        connect_timeout=v["connect_timeout"], max_body_bytes=v["max_body_bytes"],
        retry_after=v["retry_after"], shutdown_grace=v["shutdown_grace"], results_log=v["results_log"],
        log_level=v["log_level"], health_path=v["health"]["path"], health_interval=v["health"]["interval"],
        health_timeout=v["health"]["timeout"], contract=Contract(**rules),
        admin_listen=admin["listen"], admin_token=token, source=source,
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load(path: str | None, overrides: dict | None = None) -> Config:
    """Read the YAML file (if any), lay command-line overrides over it, validate."""
    data: dict = {}
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f)
        except OSError as e:
            raise ConfigError("--config", f"cannot read {path}: {e.strerror}") from e
        except yaml.YAMLError as e:
            raise ConfigError("--config", f"{path} is not valid YAML: {e}") from e
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError("(top level)", f"{path} must hold a mapping of settings, got {type(data).__name__}")
    merged = dict(data)
    for key, value in (overrides or {}).items():
        if value is not None:
            merged[key] = value
    return build(merged, source=path)
