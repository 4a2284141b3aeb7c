"""dcu-proxy configuration: the YAML schema, its defaults and its validation.

One table (`SCHEMA`) names every key, its default and how it is checked; docs/proxy.md mirrors it.
A bad file raises ConfigError naming the key and the reason, and the command exits non-zero.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
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


def _aging(key, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
        raise ConfigError(key, f"must be a number >= 1 (how many times its FIFO wait a request may wait at most; "
                               f"1 is FIFO), got {value!r}")
    return float(value)


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


def _backends(key: str, value: Any) -> list:
    """Either form of `backends`: a list of URLs (every backend serves the top-level `models`), or a list of
    mappings, each naming its own models and kind (the form rendered from a host's model services)."""
    if not isinstance(value, list) or not value:
        raise ConfigError(key, f"must be a non-empty list of backend URLs, or of backends {{url, models, kind}}, "
                               f"got {value!r}")
    if all(isinstance(v, str) for v in value):
        return _list_of(_backend_url, "backend URLs")(key, value)
    specs: list[BackendSpec] = []
    where: dict[str, str] = {}  # url -> the entry that lists it
    first: dict[str, tuple[int, BackendSpec]] = {}  # model -> (index, entry) where it was first served
    for i, entry in enumerate(value):
        name = f"{key}[{i}]"
        if not isinstance(entry, dict):
            shown = entry if isinstance(entry, str) else "http://HOST:PORT"
            raise ConfigError(name, f"{entry!r} is not a backend mapping, and the list holds mappings: write "
                                    f"{{url: {shown}, models: [NAME], kind: KIND}} (a list holds URLs only, or "
                                    f"mappings only)")
        if "url" in entry and "urls" in entry:
            raise ConfigError(name, "has both `url` and `urls`: give `url` for one instance, or `urls` for "
                                    "several instances serving the same models")
        if "url" not in entry and "urls" not in entry:
            raise ConfigError(f"{name}.url", "is required: the instance's base URL, e.g. http://127.0.0.1:8002 "
                                             "(or `urls` for several instances serving the same models)")
        if "models" not in entry:
            raise ConfigError(f"{name}.models", "is required: the names this instance serves (its vLLM "
                                                "--served-model-name), e.g. [Qwen3-32B]")
        if "kind" not in entry:
            raise ConfigError(f"{name}.kind", f"is required: one of {', '.join(KINDS)}")
        v = _apply(BACKEND_SCHEMA, entry, f"{name}.")
        models = tuple(v["models"])
        urls = [(f"{name}.url", v["url"])] if v["url"] else \
            [(f"{name}.urls[{j}]", u) for j, u in enumerate(v["urls"])]
        for at, url in urls:
            if url in where:
                raise ConfigError(at, f"{url} is listed twice (also {where[url]}): one instance is one entry; "
                                      f"list every name it serves in that entry's `models`")
            where[url] = at
        spec = BackendSpec("", models, v["kind"], v["concurrency"], v["max_model_len"])
        for model in models:
            if model not in first:
                first[model] = (i, spec)
                continue
            j, other = first[model]
            if other.kind != spec.kind:
                raise ConfigError(f"{name}.kind", f"`{model}` is served as {spec.kind} here and as {other.kind} "
                                                  f"by {key}[{j}]: one model name has one kind; correct the kind, "
                                                  f"or serve the other model under another --served-model-name")
            if set(other.models) != set(models):
                raise ConfigError(f"{name}.models", f"`{model}` is also served by {key}[{j}], with the models "
                                                    f"{list(other.models)}; backends that serve a model serve the "
                                                    f"same names (one pool per model list): give this entry those "
                                                    f"models, or serve it under another --served-model-name")
            if None not in (other.max_model_len, spec.max_model_len) and other.max_model_len != spec.max_model_len:
                raise ConfigError(f"{name}.max_model_len", f"`{model}` has max_model_len {spec.max_model_len} here "
                                                           f"and {other.max_model_len} in {key}[{j}]; /v1/models "
                                                           f"reports one per model: make them equal (each "
                                                           f"instance's --max-model-len)")
        specs.extend(BackendSpec(url, models, spec.kind, spec.concurrency, spec.max_model_len) for _, url in urls)
    return specs


def _network(key: str, value: Any) -> str:
    """An address (10.20.0.5) or a network (10.20.0.0/24), IPv4 or IPv6."""
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except (TypeError, ValueError):
        raise ConfigError(key, f"must be an IP address or network such as 10.20.0.5 or 10.20.0.0/24, "
                               f"got {value!r}") from None


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

KINDS = ("chat", "vision", "embedding", "rerank", "transcription", "speech")

# One entry of `backends` in the form where each backend names its models (a host carved into model services).
BACKEND_SCHEMA: dict[str, Any] = {
    "url": (None, _optional(_backend_url)),
    "urls": (None, _optional(_list_of(_backend_url, "backend URLs"))),
    "models": (REQUIRED, _list_of(_text, "served model names")),
    "kind": (REQUIRED, _choice(*KINDS)),
    "concurrency": (None, _optional(_int(1, 1024))),
    "max_model_len": (None, _optional(_int(1))),
}

SCHEMA: dict[str, Any] = {
    "listen": ("0.0.0.0:8000", _listen),
    "backends": (REQUIRED, _backends),
    "models": (None, _optional(_list_of(_text, "served model names"))),
    "kind": (None, _optional(_choice(*KINDS))),
    "max_model_len": (None, _optional(_int(1))),
    "backend_concurrency": (4, _int(1, 1024)),
    "queue_size": (1000, _int(0, 100_000)),
    "queue_policy": ("cost", _choice("cost", "fifo")),
    "queue_aging": (4.0, _aging),
    "queue_reserve": (0, _int(0, 100_000)),
    "request_timeout": (300.0, _seconds()),
    "connect_timeout": (3.0, _seconds()),
    "max_body_bytes": (64 * 1024 * 1024, _int(1024)),
    "body_budget": (128 * 1024 * 1024, _int(1 << 20)),
    "idle_timeout": (60.0, _seconds()),
    "write_timeout": (30.0, _seconds()),
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
    # A host behind a gateway answers API calls only from the addresses in `allow` (the gateway's, and
    # loopback for the host's own checks); others get a 403 that names `url`, where they should call instead.
    # With `secret`, a call must also carry it (Authorization: Bearer <secret>, the gateway deployment's api_key):
    # an address proves nothing (any process on an allowed host, loopback included), and X-Caller is believed
    # only from a call that carried it.
    "gateway": {
        "url": (None, _optional(_text)),
        "allow": (None, _optional(_list_of(_network, "addresses or networks"))),
        "secret": (None, _optional(_text)),
    },
    # The API over TLS on a listener of its own (the same endpoints as `listen`): a host behind a gateway takes the
    # gateway's calls here, and keeps `listen` on loopback for its own checks. A SIGHUP reloads the certificate.
    "tls": {
        "listen": (None, _optional(_listen)),
        "cert": (None, _optional(_path)),
        "key": (None, _optional(_path)),
    },
    # MinerU's API on this listener under /mineru/ (file_parse, tasks, health) when `url` is set (docs/proxy.md,
    # "MinerU"): its callers pass the API's trust, a parse waits for one of `concurrency` slots in a queue of
    # `queue_size` (503 beyond), a task is refused when more than `queue_size` would wait in MinerU's own queue, an
    # upload is at most `max_upload_mb` (MinerU's own limit) and a parse ends within `timeout`.
    "mineru": {
        "url": (None, _optional(_backend_url)),
        "max_upload_mb": (100, _int(1, 1 << 20)),
        "concurrency": (2, _int(1, 1024)),
        "queue_size": (16, _int(0, 100_000)),
        "timeout": (1800.0, _seconds()),
    },
}


@dataclass(frozen=True)
class BackendSpec:
    """One vLLM instance as the proxy routes to it: its URL, the model names it serves and their kind."""

    url: str
    models: tuple
    kind: str = "chat"
    concurrency: int | None = None  # None: backend_concurrency
    max_model_len: int | None = None  # None: the top-level max_model_len


@dataclass(frozen=True)
class Contract:
    user: str = "reject"
    enable_thinking: str = "reject"
    image_urls: str = "reject"
    model: str = "reject"
    max_images: int = 9


@dataclass(frozen=True)
class Config:
    backends: tuple  # the backend URLs, in order
    models: tuple  # every served model name, in order
    specs: tuple = ()  # BackendSpec per backend URL (the plain form: every backend serves every model, of `kind`)
    listen: str = "0.0.0.0:8000"
    max_model_len: int | None = None
    backend_concurrency: int = 4
    queue_size: int = 1000
    queue_policy: str = "cost"
    queue_aging: float = 4.0
    queue_reserve: int = 0  # with queue_policy cost: the last free slots of a pool kept for cheap requests
    request_timeout: float = 300.0
    connect_timeout: float = 3.0
    max_body_bytes: int = 64 * 1024 * 1024
    body_budget: int = 128 * 1024 * 1024  # bytes of request bodies held in memory at once
    idle_timeout: float = 60.0  # a client connection without a request in progress (headers unfinished too)
    write_timeout: float = 30.0  # a write to a client that stopped reading
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
    gateway_url: str | None = None
    gateway_allow: tuple = ()  # ipaddress networks; empty: API calls from anywhere
    gateway_secret: bytes | None = None  # what the gateway's calls carry (Authorization: Bearer ...)
    tls_listen: str | None = None  # the API over TLS, with tls_cert (PEM, its chain after it) and tls_key
    tls_cert: str | None = None
    tls_key: str | None = None
    mineru_url: str | None = None  # MinerU's API, relayed under /mineru/; None: not through this proxy
    mineru_max_upload_bytes: int = 100 * 2**20
    mineru_concurrency: int = 2  # parses in flight at MinerU
    mineru_queue_size: int = 16  # parses waiting for one of them
    mineru_timeout: float = 1800.0  # arrival to the answer's end, queue included
    source: str | None = None  # the file it came from, for messages

    @property
    def listen_addr(self) -> tuple[str, int]:
        return parse_listen("listen", self.listen)

    @property
    def admin_addr(self) -> tuple[str, int] | None:
        return parse_listen("admin.listen", self.admin_listen) if self.admin_listen else None

    @property
    def tls_addr(self) -> tuple[str, int] | None:
        return parse_listen("tls.listen", self.tls_listen) if self.tls_listen else None


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
    gateway = v["gateway"]
    if bool(gateway["url"]) != bool(gateway["allow"]):
        missing = "gateway.url" if gateway["allow"] else "gateway.allow"
        raise ConfigError(missing, "is required with the other gateway key: `allow` lists the addresses API calls "
                                   "are accepted from, `url` is the gateway callers are told to use instead")
    if gateway["secret"] is not None and (not gateway["allow"] or len(gateway["secret"]) < 16):
        raise ConfigError("gateway.secret", "needs gateway.allow and url too, and at least 16 characters (a random "
                                            "string from the vault, the gateway's api_key for this host)"
                          if gateway["allow"] else "needs gateway.allow and gateway.url (the gateway it proves)")
    tls = v["tls"]
    if any(tls.values()) and not all(tls.values()):
        missing = ", ".join(f"tls.{key}" for key, value in tls.items() if not value)
        raise ConfigError(missing.split(", ")[0], f"is required with the other tls keys (missing: {missing}): "
                                                  "`listen` takes the API over TLS with the certificate `cert` "
                                                  "(PEM, chain after it) and its key `key`")
    if tls["listen"] and parse_listen("tls.listen", tls["listen"])[1] == parse_listen("listen", v["listen"])[1]:
        raise ConfigError("tls.listen", f"{tls['listen']} has the port of listen ({v['listen']}); give TLS a port "
                                        "of its own, e.g. 8443")
    if v["queue_reserve"] and v["queue_policy"] != "cost":
        raise ConfigError("queue_reserve", "needs queue_policy: cost (a reserved slot goes to a request by its "
                                           "expected cost, which only the cost order estimates); set it to 0")
    mineru = v["mineru"]
    backends = v["backends"]
    if isinstance(backends[0], str):  # the plain form: every backend serves every model
        if v["models"] is None:
            raise ConfigError("models", "is required: the served model names (vLLM's --served-model-name), "
                                        "which every backend serves; or give each backend its own: backends: "
                                        "[{url: ..., models: [...], kind: ...}]")
        specs = tuple(BackendSpec(url, tuple(v["models"]), v["kind"] or "chat") for url in backends)
    else:
        if v["models"] is not None:
            raise ConfigError("models", "must not be set when each backend names its models (backends[].models): "
                                        "remove the top-level `models`")
        if v["kind"] is not None:
            raise ConfigError("kind", "must not be set when each backend names its kind (backends[].kind): "
                                      "remove the top-level `kind`")
        specs = tuple(backends)
    models = tuple(dict.fromkeys(model for spec in specs for model in spec.models))
    return Config(
        listen=v["listen"], backends=tuple(spec.url for spec in specs), models=models, specs=specs,
        max_model_len=v["max_model_len"], backend_concurrency=v["backend_concurrency"],
        queue_size=v["queue_size"], queue_policy=v["queue_policy"], queue_aging=v["queue_aging"],
        queue_reserve=v["queue_reserve"],
        request_timeout=v["request_timeout"],
        connect_timeout=v["connect_timeout"], max_body_bytes=v["max_body_bytes"], body_budget=v["body_budget"],
        idle_timeout=v["idle_timeout"], write_timeout=v["write_timeout"],
        retry_after=v["retry_after"], shutdown_grace=v["shutdown_grace"], results_log=v["results_log"],
        log_level=v["log_level"], health_path=v["health"]["path"], health_interval=v["health"]["interval"],
        health_timeout=v["health"]["timeout"], contract=Contract(**rules),
        admin_listen=admin["listen"], admin_token=token, gateway_url=gateway["url"],
        gateway_allow=tuple(ipaddress.ip_network(n) for n in gateway["allow"] or ()),
        gateway_secret=gateway["secret"].encode() if gateway["secret"] else None,
        tls_listen=tls["listen"], tls_cert=tls["cert"], tls_key=tls["key"],
        mineru_url=mineru["url"], mineru_max_upload_bytes=mineru["max_upload_mb"] * 2**20,
        mineru_concurrency=mineru["concurrency"], mineru_queue_size=mineru["queue_size"],
        mineru_timeout=mineru["timeout"], source=source,
    )


def tls_context(config: Config) -> ssl.SSLContext | None:
    """The TLS listener's server context with the certificate and key loaded (None without `tls`); a ConfigError
    naming the file and what is wrong with it (unreadable, not PEM, a key of another certificate)."""
    if not config.tls_listen:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    for key, path in (("tls.cert", config.tls_cert), ("tls.key", config.tls_key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise ConfigError(key, f"cannot read {path}: {e.strerror}") from None
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except ssl.SSLError as e:
        raise ConfigError("tls.key", f"{config.tls_cert} and {config.tls_key} are not a PEM certificate and its own "
                                     f"key ({e.reason or e}); give the key the certificate was made for") from None
    return context


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
