"""container_engine: the engine versions DCU hosts print, which `docker run` flags each accepts, and the refusal
of an engine older than supported (docs/field-evidence.md O9)."""

from __future__ import annotations

import pytest

from ansible_collections.dcu.serving.plugins.module_utils import container_engine as engine


@pytest.mark.parametrize("text, version", [
    ("18.09.0\n", (18, 9, 0)),                          # Kylin V10 / openEuler docker-engine
    ("20.10.24+dfsg1", (20, 10, 24)),                   # Debian 12 docker.io
    ("1.13.1", (1, 13, 1)),                             # CentOS 7's docker package
    ("Docker version 19.03.8, build afacb8b7f0", (19, 3, 8)),
    ("24.0.7-ce", (24, 0, 7)),
    ("", None), ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock.", None),
])
def test_versions_as_engines_print_them(text, version):
    assert engine.parse_version(text) == version


def test_pull_never_only_where_the_engine_has_it():
    assert engine.run_flags(engine.parse_version("18.09.0")) == []
    assert engine.run_flags(engine.parse_version("19.03.15")) == []
    assert engine.run_flags(engine.parse_version("20.10.0")) == ["--pull=never"]
    assert engine.run_flags(None) == []


def test_an_engine_older_than_18_09_is_refused_with_the_fix():
    assert engine.problem("18.09.0") == "" and engine.problem("26.1.4") == ""
    said = engine.problem("1.13.1\n")
    assert said.startswith("docker 1.13.1 is older than the oldest engine supported (18.09): install docker-ce")
    assert "Cannot connect" in engine.problem("Cannot connect to the Docker daemon")


def _host(version, selinux="disabled", present=True, raw=None):
    parsed = engine.parse_version(version) if version else None
    return {"selinux": selinux, "engine": {"name": "docker", "present": present, "raw": raw or version,
                                           "version": ".".join(map(str, parsed)) if parsed else None,
                                           "version_tuple": list(parsed) if parsed else None,
                                           "error": None if parsed else "Cannot connect to the Docker daemon"}}


@pytest.mark.parametrize("host, flags", [
    (_host("20.10.24+dfsg1"), ["--pull=never"]),
    (_host("18.09.0", "enforcing"), ["--security-opt=label=disable"]),      # Kylin V10
    (_host("24.0.7", "permissive"), ["--pull=never", "--security-opt=label=disable"]),
    (_host(None), []),                                                    # unknown: the oldest's options
])
def test_every_unit_gets_the_options_its_host_takes(host, flags):
    from ansible_collections.dcu.serving.plugins.plugin_utils.engine import container_run_flags
    assert container_run_flags(host) == flags


def test_the_engine_problem_names_what_to_do():
    from ansible_collections.dcu.serving.plugins.plugin_utils.engine import container_engine_problem
    assert container_engine_problem(_host("18.09.0")) == ""
    refused = container_engine_problem(_host("1.13.1"))
    assert "docker 1.13.1 is older than the oldest engine supported (18.09)" in refused
    assert "systemctl status docker" in container_engine_problem(_host(None))
    assert container_engine_problem(_host(None, present=False)).startswith("docker is not installed")
