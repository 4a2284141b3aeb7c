"""The configuration file: defaults, validation that names the key, command-line overrides."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from dcu_serving.proxy import config as cfg
from support import python_module

BASE = {"backends": ["http://127.0.0.1:8002", "http://127.0.0.1:8003"], "models": ["MiniCPM-V-4.5"]}


def test_defaults_are_the_documented_ones():
    c = cfg.build(BASE)
    assert (c.listen, c.backend_concurrency, c.queue_size, c.request_timeout) == ("0.0.0.0:8000", 4, 1000, 300)
    assert (c.health_path, c.health_interval, c.health_timeout) == ("/health", 5.0, 2.0)
    assert c.max_body_bytes == 64 * 1024 * 1024
    assert c.contract == cfg.Contract("reject", "reject", "reject", "reject", 9)
    assert c.admin_listen == "127.0.0.1:8001" and c.admin_token is None
    assert c.results_log is None
    assert (c.queue_policy, c.queue_aging, c.queue_reserve) == ("cost", 4.0, 0)


@pytest.mark.parametrize(("data", "key", "reason"), [
    ({**BASE, "backend_concurency": 4}, "backend_concurency", "unknown key"),
    ({**BASE, "contract": {"mode": "strict", "users": "coerce"}}, "contract.users", "unknown key"),
    ({"models": ["m"]}, "backends", "is required"),
    ({"backends": BASE["backends"]}, "models", "is required"),
    ({**BASE, "backends": []}, "backends", "non-empty list"),
    ({**BASE, "backends": ["https://127.0.0.1:8002"]}, "backends[0]", "http:// URL"),
    ({**BASE, "backends": ["http://127.0.0.1"]}, "backends[0]", "host and port"),
    ({**BASE, "backends": ["http://127.0.0.1:8002/v1"]}, "backends[0]", "without a path"),
    ({**BASE, "backends": ["http://127.0.0.1:8002", "http://127.0.0.1:8002/"]}, "backends[1]", "twice"),
    ({**BASE, "backend_concurrency": 0}, "backend_concurrency", "between 1 and 1024"),
    ({**BASE, "backend_concurrency": "4"}, "backend_concurrency", "must be an integer"),
    ({**BASE, "request_timeout": -1}, "request_timeout", "> 0 seconds"),
    ({**BASE, "listen": "8000"}, "listen", "HOST:PORT"),
    ({**BASE, "listen": "0.0.0.0:99999"}, "listen", "port 1-65535"),
    ({**BASE, "health": {"interval": 1, "timeout": 2}}, "health.timeout", "must not exceed health.interval"),
    ({**BASE, "contract": {"mode": "lenient"}}, "contract.mode", "one of strict, relaxed"),
    ({**BASE, "contract": {"user": "fix"}}, "contract.user", "one of reject, coerce"),
    ({**BASE, "admin": {"listen": "0.0.0.0:8001"}}, "admin.listen", "set admin.token"),
    ({**BASE, "results_log": "results.jsonl"}, "results_log", "absolute file path"),
    ({**BASE, "health": "often"}, "health", "must be a mapping"),
    ({**BASE, "queue_reserve": -1}, "queue_reserve", "between 0 and"),
    ({**BASE, "queue_policy": "fifo", "queue_reserve": 2}, "queue_reserve", "needs queue_policy: cost"),
])
def test_a_bad_value_names_the_key_and_the_reason(data, key, reason):
    with pytest.raises(cfg.ConfigError) as e:
        cfg.build(data)
    assert e.value.key == key
    assert reason in str(e.value)


def test_relaxed_mode_relaxes_every_rule_and_a_rule_can_be_set_alone():
    relaxed = cfg.build({**BASE, "contract": {"mode": "relaxed"}}).contract
    assert relaxed == cfg.Contract("coerce", "move", "allow", "pass", 0)
    mixed = cfg.build({**BASE, "contract": {"mode": "strict", "enable_thinking": "move", "max_images": 4}}).contract
    assert mixed == cfg.Contract("reject", "move", "reject", "reject", 4)


def test_a_public_admin_listener_is_allowed_with_a_token():
    c = cfg.build({**BASE, "admin": {"listen": "0.0.0.0:8001", "token": "s3cret"}})
    assert c.admin_addr == ("0.0.0.0", 8001) and c.admin_token == "s3cret"


def test_command_line_overrides_the_file(tmp_path):
    path = tmp_path / "proxy.yml"
    path.write_text(yaml.safe_dump({**BASE, "listen": "127.0.0.1:9000"}))
    c = cfg.load(str(path), {"listen": "127.0.0.1:9100", "backends": ["http://10.0.0.1:8002"], "models": None})
    assert c.listen == "127.0.0.1:9100"
    assert c.backends == ("http://10.0.0.1:8002",)
    assert c.models == ("MiniCPM-V-4.5",)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(python_module("dcu_serving.proxy", *args), capture_output=True, text=True, timeout=30)


def test_the_command_exits_non_zero_naming_the_key(tmp_path):
    path = tmp_path / "proxy.yml"
    path.write_text(yaml.safe_dump({**BASE, "queue_size": -5}))
    done = _run("--config", str(path))
    assert done.returncode == 2
    assert "queue_size: must be between 0 and 100000, got -5" in done.stderr

    path.write_text("backends: [http://127.0.0.1:8002\n")
    done = _run("--config", str(path))
    assert done.returncode == 2 and "is not valid YAML" in done.stderr

    done = _run("--config", str(tmp_path / "missing.yml"))
    assert done.returncode == 2 and "cannot read" in done.stderr


def test_check_validates_without_serving(tmp_path):
    path = tmp_path / "proxy.yml"
    path.write_text(yaml.safe_dump(BASE))
    done = _run("--check", "--config", str(path))
    assert done.returncode == 0, done.stderr
    assert "2 backends" in done.stdout
    done = _run("--check", "--backend", "http://127.0.0.1:8002", "--model", "m", "--listen", "nowhere")
    assert done.returncode == 2 and "listen:" in done.stderr


def test_plain_backends_are_chat_unless_kind_says_otherwise():
    assert {spec.kind for spec in cfg.build(BASE).specs} == {"chat"}
    embedding = cfg.build({**BASE, "models": ["bge-m3"], "kind": "embedding"})
    assert [(spec.url, spec.models, spec.kind) for spec in embedding.specs] == [
        (url, ("bge-m3",), "embedding") for url in BASE["backends"]]
    with pytest.raises(cfg.ConfigError, match="kind: must be one of chat, vision, embedding, rerank, transcription, "
                                              "speech; got 'embed'"):
        cfg.build({**BASE, "kind": "embed"})


def test_the_command_line_names_what_its_backends_serve():
    done = _run("--check", "--backend", "embedding=http://127.0.0.1:8008", "--model", "bge-m3")
    assert done.returncode == 0, done.stderr
    assert "models bge-m3 (embedding, 1)" in done.stdout
    done = _run("--check", "--backend", "embeding=http://127.0.0.1:8008", "--model", "bge-m3")
    assert done.returncode == 2
    assert ("argument --backend: unknown kind 'embeding' in 'embeding=http://127.0.0.1:8008': write KIND=URL with "
            "KIND one of chat, vision, embedding, rerank, transcription, speech, or the URL alone") in done.stderr
    # A plain --backend beside a named kind is chat: two kinds for one list of models.
    done = _run("--check", "--backend", "embedding=http://127.0.0.1:8008", "--backend", "http://127.0.0.1:8002",
                "--model", "bge-m3")
    assert done.returncode == 2
    assert "the backends are of 2 kinds (chat, embedding)" in done.stderr
    assert "backends: [{url: URL, models: [NAME], kind: KIND}]" in done.stderr
    assert "[KIND=]URL" in _run("--help").stdout


# -- the form where each backend names its models and kind (a host carved into model services) --

SERVICES = {"backends": [
    {"url": "http://127.0.0.1:8002", "models": ["Qwen3-32B"], "kind": "chat", "max_model_len": 32768},
    {"urls": ["http://127.0.0.1:8004", "http://127.0.0.1:8005"], "models": ["MiniCPM-V-4.5"], "kind": "vision"},
    {"url": "http://127.0.0.1:8008", "models": ["bge-m3", "embed"], "kind": "embedding", "concurrency": 64},
    {"url": "http://127.0.0.1:8009", "models": ["bge-reranker-v2-m3"], "kind": "rerank"},
]}


def test_the_plain_form_is_one_pool_of_every_backend_serving_every_model():
    c = cfg.build({**BASE, "models": ["MiniCPM-V-4.5", "minicpm"]})
    assert c.backends == tuple(BASE["backends"]) and c.models == ("MiniCPM-V-4.5", "minicpm")
    assert c.specs == tuple(cfg.BackendSpec(url, ("MiniCPM-V-4.5", "minicpm")) for url in BASE["backends"])
    assert {spec.kind for spec in c.specs} == {"chat"}


def test_each_backend_names_its_models_and_kind():
    c = cfg.build(SERVICES)
    assert c.backends == ("http://127.0.0.1:8002", "http://127.0.0.1:8004", "http://127.0.0.1:8005",
                          "http://127.0.0.1:8008", "http://127.0.0.1:8009")
    assert c.models == ("Qwen3-32B", "MiniCPM-V-4.5", "bge-m3", "embed", "bge-reranker-v2-m3")
    assert c.specs[0] == cfg.BackendSpec("http://127.0.0.1:8002", ("Qwen3-32B",), "chat", None, 32768)
    assert c.specs[1].models == c.specs[2].models == ("MiniCPM-V-4.5",)  # `urls`: one entry, several instances
    assert (c.specs[3].kind, c.specs[3].concurrency) == ("embedding", 64)
    # What the dcu_proxy role renders: one entry per instance, the same shape whatever the kind.
    rendered = {"backends": [{"url": f"http://127.0.0.1:{8002 + i}", "models": ["MiniCPM-V-4.5"], "kind": "vision"}
                             for i in range(8)]}
    assert cfg.build(rendered).models == ("MiniCPM-V-4.5",)


def _entry(i: int, **changes) -> dict:
    return {**SERVICES["backends"][i], **changes}


@pytest.mark.parametrize(("backends", "key", "reason"), [
    ([_entry(0), _entry(3, models=["Qwen3-32B"])], "backends[1].kind",
     "`Qwen3-32B` is served as rerank here and as chat by backends[0]"),
    ([_entry(0), _entry(3, url="http://127.0.0.1:8002")], "backends[1].url",
     "http://127.0.0.1:8002 is listed twice (also backends[0].url)"),
    ([_entry(1), _entry(0, url="http://127.0.0.1:8005/")], "backends[1].url",
     "listed twice (also backends[0].urls[1])"),
    ([_entry(1, urls=["http://127.0.0.1:8004", "http://127.0.0.1:8004"])], "backends[0].urls[1]", "listed twice"),
    ([_entry(0), "http://127.0.0.1:8003"], "backends[1]", "is not a backend mapping"),
    ([_entry(0), {"url": "http://127.0.0.1:8003", "kind": "chat"}], "backends[1].models", "is required"),
    ([{"url": "http://127.0.0.1:8003", "models": ["m"]}], "backends[0].kind", "is required: one of chat, vision"),
    ([{"models": ["m"], "kind": "chat"}], "backends[0].url", "is required"),
    ([_entry(0, urls=["http://127.0.0.1:8003"])], "backends[0]", "both `url` and `urls`"),
    ([_entry(0, kind="embed")], "backends[0].kind", "one of chat, vision, embedding, rerank, transcription"),
    ([_entry(0, cards=[0, 1])], "backends[0].cards", "unknown key"),
    ([_entry(0, models=[])], "backends[0].models", "non-empty list"),
    ([_entry(2), _entry(3, models=["bge-m3"], kind="embedding")], "backends[1].models",
     "`bge-m3` is also served by backends[0], with the models ['bge-m3', 'embed']"),
    ([_entry(0), _entry(0, url="http://127.0.0.1:8003", max_model_len=8192)], "backends[1].max_model_len",
     "max_model_len 8192 here and 32768 in backends[0]"),
    ([_entry(0, url="https://127.0.0.1:8002")], "backends[0].url", "http:// URL"),
    ([_entry(0, concurrency=0)], "backends[0].concurrency", "between 1 and 1024"),
])
def test_a_bad_backend_entry_names_the_key_and_the_fix(backends, key, reason):
    with pytest.raises(cfg.ConfigError) as e:
        cfg.build({"backends": backends})
    assert e.value.key == key
    assert reason in str(e.value)


def test_top_level_models_belong_to_the_plain_form_only():
    with pytest.raises(cfg.ConfigError) as e:
        cfg.build({**SERVICES, "models": ["Qwen3-32B"]})
    assert e.value.key == "models" and "remove the top-level `models`" in str(e.value)
    with pytest.raises(cfg.ConfigError) as e:
        cfg.build({**SERVICES, "kind": "chat"})
    assert e.value.key == "kind" and "remove the top-level `kind`" in str(e.value)


def test_every_api_refusal_says_how_to_declare_a_kind_that_serves_it():
    """The 400 for a model of the wrong kind names the kind to declare — for every API, speech included."""
    from types import SimpleNamespace

    from dcu_serving.proxy import routing

    group = SimpleNamespace(backends=[SimpleNamespace(url="http://10.0.0.5:8002")])
    for api in set(routing.APIS.values()):
        hint = routing.declare(api, "m", group)
        kind = hint.split("`--backend ")[1].split("=")[0]
        assert kind in api.kinds and kind in cfg.KINDS, (api.name, hint)
