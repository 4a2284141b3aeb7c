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
