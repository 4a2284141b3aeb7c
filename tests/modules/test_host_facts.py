"""host_probe's parsed facts (host_facts): systemd's version and the container engine's, read once and parsed in
one place for every role - from the texts real hosts print, engines of every age, a daemon that does not answer
and no engine at all."""

from __future__ import annotations

import sys

import pytest

from ansible_collections.dcu.serving.plugins.module_utils.host_probe import engine_version, systemd_version


@pytest.mark.parametrize("text, version", [
    ("systemd 219\n+PAM +AUDIT +SELINUX +IMA -APPARMOR +SMACK +SYSVINIT +UTMP +LIBCRYPTSETUP\n", 219),  # CentOS 7
    ("systemd 243 (v243-36.oe1)\n+PAM +AUDIT +SELINUX\n", 243),  # openEuler 20.03
    ("systemd 252 (252.36-1~deb12u1)\n+PAM +AUDIT +SELINUX +APPARMOR\n", 252),  # Debian 12 (the emulated node)
    ("", None),
    ("bash: systemctl: command not found\n", None),
])
def test_systemd_version_from_systemctl(text, version):
    assert systemd_version(text) == version


@pytest.mark.parametrize("text, version, parts", [
    ("24.0.7\n", "24.0.7", [24, 0, 7]),
    ("20.10.24+dfsg1\n", "20.10.24", [20, 10, 24]),  # Debian's docker.io
    ("18.09.0\n", "18.9.0", [18, 9, 0]),  # the year.month scheme with a leading zero
    ("17.03.2-ce\n", "17.3.2", [17, 3, 2]),
    ("1.13.1\n", "1.13.1", [1, 13, 1]),  # EL7's docker package
    ("4.9.4\n", "4.9.4", [4, 9, 4]),  # podman-docker
    ("25.0\n", "25.0.0", [25, 0, 0]),
    ("\n", None, None),
    ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n", None, None),
])
def test_engine_version_compares_as_a_version_and_as_a_list(text, version, parts):
    found = engine_version(text)
    assert (found and found["version"], found and found["version_tuple"]) == (version, parts)


def test_the_pull_flag_decision_an_engine_version_makes():
    """--pull came with Docker 20.10: the list form orders 18.09 and 1.13 below it, 24.0 above (a string would put
    '1.13.1' and '18.09.0' the wrong way round against '20.10')."""
    newer = [t for t in ("1.13.1", "17.03.2-ce", "18.09.0", "19.03.15", "20.10.0", "24.0.7")
             if engine_version(t)["version_tuple"] >= [20, 10]]
    assert newer == ["20.10.0", "24.0.7"]


def _tool(directory, name, out="", err="", rc=0):
    script = directory / name
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({out!r})\nsys.stderr.write({err!r})\n"
                      f"sys.exit({rc})\n")
    script.chmod(0o755)
    return script


@pytest.fixture
def fake_path(tmp_path, monkeypatch):
    """A bin directory first on PATH, for systemctl."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def test_host_probe_returns_the_parsed_facts_of_an_old_host(module_runner, fake_path):
    _tool(fake_path, "systemctl", out="systemd 219\n+PAM +AUDIT +SELINUX\n")
    engine = _tool(fake_path, "docker", out="1.13.1\n")
    result = module_runner("host_probe", {"host_facts": True, "engine": str(engine), "_ansible_check_mode": True})
    assert not result.get("failed"), result
    assert result["ansible_facts"]["dcu_host"] == {
        "selinux": "disabled", "systemd_version": 219, "systemd_error": None,
        "engine": {"name": "docker", "present": True, "version": "1.13.1", "version_tuple": [1, 13, 1],
                   "raw": "1.13.1", "error": None}}


def test_an_engine_whose_daemon_does_not_answer_and_no_engine_at_all(module_runner, fake_path, tmp_path):
    _tool(fake_path, "systemctl", out="systemd 252 (252.36-1~deb12u1)\n")
    down = _tool(fake_path, "docker", rc=1, err="Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                                              "Is the docker daemon running?\n")
    host = module_runner("host_probe", {"host_facts": True, "engine": str(down)})["ansible_facts"]["dcu_host"]
    assert host["systemd_version"] == 252
    assert host["engine"]["present"] is True and host["engine"]["version"] is None
    assert host["engine"]["error"].startswith("Cannot connect to the Docker daemon")
    result = module_runner("host_probe", {"host_facts": True, "engine": str(tmp_path / "no" / "docker")})
    assert not result.get("failed"), result
    engine = result["ansible_facts"]["dcu_host"]["engine"]
    assert (engine["present"], engine["version"], engine["version_tuple"]) == (False, None, None)
    assert "No such file" in engine["error"]


def test_without_host_facts_nothing_is_run(module_runner, fake_path):
    _tool(fake_path, "systemctl", rc=1, err="should not run\n")
    result = module_runner("host_probe", {})
    assert "dcu_host" not in result["ansible_facts"]


@pytest.mark.parametrize("out, rc, mode", [("Enforcing\n", 0, "enforcing"), ("Permissive\n", 0, "permissive"),
                                           ("Disabled\n", 0, "disabled"), (None, None, "disabled")])
def test_selinux_as_getenforce_says_and_none_without_it(module_runner, fake_path, out, rc, mode):
    # EL and Kylin hosts carry getenforce (libselinux-utils); Debian and Ubuntu hosts have no SELinux and no command.
    _tool(fake_path, "systemctl", out="systemd 243\n")
    if out is not None:
        _tool(fake_path, "getenforce", out=out, rc=rc)
    host = module_runner("host_probe", {"host_facts": True, "engine": str(fake_path / "docker")})["ansible_facts"]
    assert host["dcu_host"]["selinux"] == mode
