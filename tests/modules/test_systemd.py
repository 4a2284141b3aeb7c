"""Units rendered for the oldest systemd a DCU host runs: CentOS 7.6 has 219, Kylin V10 and openEuler 20.03
243, Ubuntu 20.04 245 (docs/field-evidence.md). An old systemd silently drops what it does not know."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from jinja2 import Environment

from ansible_collections.dcu.serving.plugins.plugin_utils.systemd import (
    SINCE,
    changed_lines,
    failed_start_lines,
    systemd_compatible,
)
from support import REPO


def _directives(unit: str) -> dict:
    out = {}
    for line in unit.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def _render_proxy_unit(version: int) -> str:
    """roles/dcu_proxy/templates/dcu-proxy.service.j2 rendered as Ansible would, for one systemd version."""
    env = Environment(keep_trailing_newline=True)
    env.filters["dcu.serving.systemd_compatible"] = systemd_compatible
    source = (REPO / "roles/dcu_proxy/templates/dcu-proxy.service.j2").read_text()
    return env.from_string(source).render(
        ansible_managed="managed", __dcu_proxy_config="/etc/dcu-serving/proxy.yml", dcu_proxy_user="dcu-proxy",
        __dcu_proxy_bin="/opt/dcu-serving/venv/bin/dcu-proxy", dcu_proxy_settings={}, __dcu_proxy_log_dir="/var/log",
        __dcu_proxy_port=8000, __dcu_proxy_tls_port=0, ansible_facts={"dcu_host": {"systemd_version": version}},
        __dcu_proxy_runtime="venv",
        __dcu_proxy_container_command="")


def test_systemd_219_gets_the_old_spellings_and_nothing_it_does_not_know():
    unit = _render_proxy_unit(219)
    directives = _directives(unit)
    assert directives["Type"] == ["notify"], "the venv's unit: READY=1 from the proxy (known to 219)"
    assert _directives(systemd_compatible("[Service]\nType=exec\n", 219))["Type"] == ["simple"], "Type=exec needs 240"
    assert directives["ProtectSystem"] == ["full"], "ProtectSystem=strict needs 232"
    assert directives["ReadWriteDirectories"] == ["/var/log"] and "ReadWritePaths" not in directives
    assert directives["CPUShares"] == ["8192"] and "CPUWeight" not in directives, "800 of 100 is 8192 of 1024"
    newer = {name for name, (since, _older) in SINCE.items() if "=" not in name and since > 219}
    assert not newer & set(directives), newer & set(directives)
    assert "SystemCallFilter" not in directives, "@system-service groups need 231"
    assert directives["NoNewPrivileges"] == ["yes"] and directives["PrivateTmp"] == ["yes"]


def test_a_current_systemd_keeps_the_whole_hardening():
    directives = _directives(_render_proxy_unit(252))
    assert directives["Type"] == ["notify"] and directives["ProtectSystem"] == ["strict"]
    for name in ("ProtectKernelLogs", "ProtectClock", "ProtectProc", "RestrictSUIDSGID", "CPUWeight"):
        assert name in directives, name
    assert directives["SystemCallFilter"] == ["@system-service", "~@privileged @resources"]


@pytest.mark.parametrize("version, present, absent", [
    (243, ["ProtectHostname", "RestrictSUIDSGID", "NUMAPolicy"], ["ProtectKernelLogs", "ProtectClock"]),
    (245, ["ProtectKernelLogs", "ProtectClock"], ["ProtectProc", "ProcSubset"]),
    (254, ["RestartSteps", "RestartMaxDelaySec"], []),
])
def test_each_version_gets_what_it_knows(version, present, absent):
    unit = "[Service]\n" + "".join(f"{name}=yes\n" for name in (
        "ProtectHostname", "RestrictSUIDSGID", "NUMAPolicy", "ProtectKernelLogs", "ProtectClock", "ProtectProc",
        "ProcSubset", "RestartSteps", "RestartMaxDelaySec"))
    directives = _directives(systemd_compatible(unit, version))
    assert all(name in directives for name in present) and not any(name in directives for name in absent)


def test_memory_and_tasks_limits_take_their_older_spelling_or_go():
    """MemoryMax= is MemoryLimit= before 231 (CentOS 7.6's 219 caps the memory all the same); TasksMax= came in 227."""
    unit = "[Service]\nMemoryMax=96G\nTasksMax=8192\nPrivateMounts=yes\nIPAddressDeny=any\n"
    assert _directives(systemd_compatible(unit, 219)) == {"MemoryLimit": ["96G"]}
    assert _directives(systemd_compatible(unit, 231)) == {"MemoryMax": ["96G"], "TasksMax": ["8192"]}
    assert _directives(systemd_compatible(unit, 235)) == {"MemoryMax": ["96G"], "TasksMax": ["8192"],
                                                           "IPAddressDeny": ["any"]}
    assert systemd_compatible(unit, 239) == unit


def test_the_start_limit_moves_back_to_service_before_230():
    unit = "[Unit]\nStartLimitIntervalSec=1800\nStartLimitBurst=5\n\n[Service]\nType=simple\n"
    old = systemd_compatible(unit, 219)
    assert old.index("[Service]") < old.index("StartLimitInterval=1800") and "StartLimitIntervalSec" not in old
    assert systemd_compatible(unit, 230) == unit


def test_a_version_that_is_not_a_number_is_refused():
    with pytest.raises(AnsibleFilterError):
        systemd_compatible("[Service]\n", "systemd 252 (252.39-1~deb12u2)")


# The log of vllm@0 when its model never became ready (CI, molecule default): systemd started it again after the
# failed start, and the rollback stopped that start - the last 8 lines were all about the stopped one.
NEVER_READY_LOG = """Starting vllm@0.service - vLLM instance 0 (dcu-serving)...
INFO [dcu-vllm-sim] listening on 0.0.0.0:8000
waiting for http://127.0.0.1:8002: /health: [Errno 111] Connection refused
waiting for http://127.0.0.1:8002: /health answers 503
http://127.0.0.1:8002 does not serve m after 30s (/health answers 503); raise dcu_vllm_start_timeout
vllm@0.service: Control process exited, code=exited, status=1/FAILURE
vllm@0.service: Failed with result 'exit-code'.
Failed to start vllm@0.service - vLLM instance 0 (dcu-serving).
vllm@0.service: Scheduled restart job, restart counter is at 1.
Stopped vllm@0.service - vLLM instance 0 (dcu-serving).
Starting vllm@0.service - vLLM instance 0 (dcu-serving)...
waiting for http://127.0.0.1:8002: /health: [Errno 111] Connection refused
vllm@0.service: Control process exited, code=killed, status=15/TERM
vllm@0.service: Failed with result 'signal'.
Stopped vllm@0.service - vLLM instance 0 (dcu-serving).""".splitlines()


def test_the_failed_start_is_told_by_the_waiters_verdict_not_by_the_stopped_restart():
    lines = failed_start_lines(NEVER_READY_LOG, 4)
    assert lines[-1].startswith("http://127.0.0.1:8002 does not serve m after 30s (/health answers 503)")
    assert lines[0] == "INFO [dcu-vllm-sim] listening on 0.0.0.0:8000" and len(lines) == 4
    # the tail alone says nothing of why: what the message said before
    assert not any("answers 503" in line for line in NEVER_READY_LOG[-8:])


def test_a_crash_the_waiter_saw_is_its_verdict_and_a_log_without_one_gives_its_tail():
    crashed = ["ERROR [dcu-vllm-sim] simulated crash: fault crash",
               "the service's main process (pid 4711) exited after 3.2s before http://127.0.0.1:8002 served m; its "
               "log above says why", "vllm@0.service: Failed with result 'exit-code'."]
    assert failed_start_lines(crashed, 8) == crashed[:2]
    assert failed_start_lines(NEVER_READY_LOG[10:], 3) == NEVER_READY_LOG[-3:]
    assert failed_start_lines([], 8) == [] and failed_start_lines(None) == []


def test_a_units_change_is_told_both_ways_line_by_line():
    was = "[Service]\n  --env=PROXY_PORT=19530 --env=METRICS_PORT=9091 \\\nRestart=on-failure\n"
    now = "[Service]\n  --env=PROXY_PORT=19530 --env=METRICS_PORT=8000 \\\nRestart=on-failure\n"
    assert changed_lines(now, was) == {"now": ["--env=PROXY_PORT=19530 --env=METRICS_PORT=8000 \\"],
                                       "was": ["--env=PROXY_PORT=19530 --env=METRICS_PORT=9091 \\"]}
    assert changed_lines(was, was) == {"now": [], "was": []}


def test_a_changed_comment_or_blank_line_is_not_told_as_the_change():
    """The env files' header names the run that wrote them: a rollback's message tells the settings that moved."""
    was = "# written by dcu.serving for vllm@0 (card 0)\nDCU_VLLM_IMAGE_ID=sha256:old\n\nDCU_VLLM_PORT=8001\n"
    now = ("# written by dcu.serving for vllm@0 (card 0), again\n\nDCU_VLLM_IMAGE_ID=sha256:new\n; note\n"
           "DCU_VLLM_PORT=8001\n\n")
    assert changed_lines(now, was) == {"now": ["DCU_VLLM_IMAGE_ID=sha256:new"],
                                       "was": ["DCU_VLLM_IMAGE_ID=sha256:old"]}
    assert changed_lines("# only a comment\n", "") == {"now": [], "was": []}
