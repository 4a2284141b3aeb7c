"""cluster_health: argument errors name the option, before anything is polled; a real status endpoint
(a small HTTP server in the test) is read through dcu_http, never through the environment's HTTP proxy."""

from __future__ import annotations

import os
import time

import pytest

from support import free_port

CLOSED = f"http://127.0.0.1:{free_port()}"  # nothing listens there


# What each did before it was an argument error:
@pytest.mark.parametrize("url", [
    "127.0.0.1:8000",            # no scheme: polled until the timeout, then "dcu-proxy does not answer"
    "http://127.0.0.1:99999",    # port out of range: the same, "connection refused"
    "http://127.0.0.1:80a",      # port not a number: a Python traceback from http.client
    "http://",                   # no host: polled until the timeout, then blamed dcu-proxy
    "ftp://127.0.0.1:8000",      # not HTTP: polled with urllib's FTP handler
])
def test_malformed_url_is_an_argument_error(module_runner, url):
    result = module_runner("cluster_health", {"url": url, "timeout": 1, "interval": 0.1})
    assert result.get("failed"), result
    assert result["msg"].startswith("url: "), result["msg"]
    assert repr(url) in result["msg"] and "http://127.0.0.1:8000" in result["msg"]


@pytest.mark.parametrize("interval", [-1, 0])
def test_interval_that_is_not_positive_is_an_argument_error(module_runner, interval):
    # Against a closed port the module polls, then slept: -1 was a Python traceback (ValueError), 0 a busy loop.
    result = module_runner("cluster_health", {"url": CLOSED, "timeout": 2, "interval": interval})
    assert result.get("failed"), result
    assert result["msg"].startswith("interval: "), result["msg"]
    assert "positive" in result["msg"]


@pytest.mark.parametrize(("option", "value"), [("timeout", -1), ("request_timeout", -5), ("expected", -1)])
def test_negative_timeouts_and_counts_are_argument_errors(module_runner, option, value):
    result = module_runner("cluster_health", {"url": CLOSED, "timeout": 0, option: value})
    assert result.get("failed"), result
    assert result["msg"].startswith(option + ": "), result["msg"]


def test_polls_the_proxy_directly_although_the_environment_names_an_http_proxy(
        module_runner, http_server, monkeypatch):
    proxy = http_server({})  # the environment's HTTP proxy: 404 to anything
    status = http_server({"/__lb_status": (200, {"healthy": 1, "total": 1, "backends": [
        {"url": "http://127.0.0.1:8002", "healthy": True, "active": 0, "last_error": None}]})})
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, proxy.url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    result = module_runner("cluster_health", {"url": status.url, "expected": 1, "timeout": 5})
    assert not result.get("failed"), result.get("msg", result)
    assert result["summary"] == "1/1" and result["backends"][0]["unit"] == "vllm@0"
    assert [seen["line"] for seen in status.seen] == ["GET /__lb_status HTTP/1.1"]
    assert proxy.seen == []


def test_a_proxy_that_does_not_answer_is_named_at_the_timeout(module_runner):
    result = module_runner("cluster_health", {"url": CLOSED, "timeout": 0.3, "interval": 0.1})
    assert result.get("failed"), result
    assert result["msg"].startswith(f"dcu-proxy does not answer on {CLOSED}/__lb_status (connection refused)")
    assert "journalctl -u dcu-proxy" in result["msg"] and result["summary"] == "0/0"


def test_a_drained_backend_does_not_count_and_is_named_with_how_to_undrain_it(module_runner, http_server):
    """An instance a failed restart left drained answers /health, but the proxy sends it no caller: not 2/2. No
    wait lifts a drain, so the check says so at once instead of polling until its timeout."""
    backends = [{"url": "http://127.0.0.1:8002", "healthy": True, "draining": False, "active": 0, "last_error": None},
                {"url": "http://127.0.0.1:8003", "healthy": True, "draining": True, "active": 0, "last_error": None}]
    status = http_server({"/__lb_status": (200, {"healthy": 2, "total": 2, "backends": backends})})
    started = time.monotonic()
    result = module_runner("cluster_health", {"url": status.url, "expected": 2, "timeout": 60, "interval": 0.1,
                                              "host": "gpu-07"})
    assert time.monotonic() - started < 10  # was the whole timeout
    assert result.get("failed"), result
    assert result["msg"].startswith("1/2 healthy (expected 2) after "), result["msg"]
    assert ", not waiting for drained backends: " in result["msg"], result["msg"]
    assert "card 1: connection refused on 127.0.0.1:8003; drained in the proxy" in result["msg"], result["msg"]
    assert ("""`ansible-playbook -i <inventory> playbooks/rolling_restart.yml --limit gpu-07 -e """
            """'{"dcu_vllm_restart_cards": [1]}'` restarts it, checks it with a real request and undrains it""") \
        in result["msg"], result["msg"]
    assert [b["draining"] for b in result["backends"]] == [False, True]
    assert len(status.seen) == 1  # one look at the proxy


def test_a_drain_the_expected_count_leaves_room_for_is_no_failure(module_runner, http_server):
    backends = [{"url": "http://127.0.0.1:8002", "healthy": True, "draining": False, "active": 0, "last_error": None},
                {"url": "http://127.0.0.1:8003", "healthy": True, "draining": True, "active": 0, "last_error": None}]
    status = http_server({"/__lb_status": (200, {"healthy": 2, "total": 2, "backends": backends})})
    result = module_runner("cluster_health", {"url": status.url, "expected": 1, "timeout": 5})
    assert not result.get("failed") and result["summary"] == "1/2", result


def test_a_proxy_that_does_not_report_draining_is_taken_at_its_healthy_count(module_runner, http_server):
    status = http_server({"/__lb_status": (200, {"healthy": 1, "total": 1, "backends": [
        {"url": "http://127.0.0.1:8002", "healthy": True, "active": 0, "last_error": None}]})})
    result = module_runner("cluster_health", {"url": status.url, "expected": 1, "timeout": 5})
    assert not result.get("failed") and result["summary"] == "1/1", result


def _fake_systemctl(bin_dir, active="active", sub="running"):
    """systemctl show as systemd answers it for dcu-proxy, whatever the machine's own systemd is."""
    script = bin_dir / "systemctl"
    script.write_text("#!/bin/sh\nprintf 'Id=dcu-proxy.service\\nLoadState=loaded\\nActiveState=%s\\nSubState=%s\\n"
                      "Result=success\\nNRestarts=0\\nStateChangeTimestampMonotonic=1\\n' " f"{active} {sub}\n")
    script.chmod(0o755)


def test_a_url_that_is_not_where_the_proxy_listens_fails_at_once_naming_both(module_runner, tmp_path):
    """The issue's case: dcu-proxy moved to :9000, the play asks :8000 - named in seconds, not after 300 s."""
    config = tmp_path / "proxy.yml"
    config.write_text("admin:\n  listen: 127.0.0.1:8001\nlisten: 0.0.0.0:9000\nbackends: []\n")
    started = time.monotonic()
    result = module_runner("cluster_health", {"url": CLOSED, "timeout": 300, "interval": 0.1,
                                              "url_source": "dcu_proxy_listen 0.0.0.0:8000 (a stale -e)",
                                              "proxy_config": str(config)})
    took = time.monotonic() - started
    assert result.get("failed"), result
    assert took < 10, f"{took:.1f}s"
    assert result["msg"].startswith(f"dcu-proxy refuses connections on {CLOSED} (the URL from dcu_proxy_listen "
                                    f"0.0.0.0:8000 (a stale -e)), but {config} says it listens on 0.0.0.0:9000, "
                                    "which is http://127.0.0.1:9000: the URL is not the proxy's"), result["msg"]


def test_a_proxy_that_is_active_but_refuses_fails_after_the_grace(module_runner, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_systemctl(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    started = time.monotonic()
    result = module_runner("cluster_health", {"url": CLOSED, "timeout": 300, "interval": 0.2, "refused_grace": 1,
                                              "url_source": "dcu_proxy_listen 0.0.0.0:8000",
                                              "proxy_config": str(tmp_path / "absent.yml")})
    took = time.monotonic() - started
    assert result.get("failed"), result
    assert 1 <= took < 10, f"{took:.1f}s"
    assert f"dcu-proxy refuses connections on {CLOSED} (the URL from dcu_proxy_listen 0.0.0.0:8000) for 1s, and " \
           "dcu-proxy.service active (running)" in result["msg"], result["msg"]


def test_a_proxy_still_starting_is_waited_for(module_runner, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_systemctl(bin_dir, "activating", "start")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    result = module_runner("cluster_health", {"url": CLOSED, "timeout": 1.5, "interval": 0.2, "refused_grace": 0.5,
                                              "url_source": "dcu_proxy_listen 0.0.0.0:8000",
                                              "proxy_config": str(tmp_path / "absent.yml")})
    assert result.get("failed"), result
    assert result["msg"].startswith(f"dcu-proxy does not answer on {CLOSED}/__lb_status (connection refused); "
                                    "the URL is from dcu_proxy_listen 0.0.0.0:8000 after 1."), result["msg"]
