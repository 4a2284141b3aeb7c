"""Runtime host on a node without network: each card's `vllm serve` runs from the venv as dcu-serving."""

from __future__ import annotations

testinfra_hosts = ["air-host"]
CARDS = 2


def test_each_card_runs_as_the_service_user_with_its_card_and_hardening(host):
    assert host.check_output("docker ps --quiet") == ""  # no container at all
    for card in range(CARDS):
        unit = f"vllm@{card}"
        pid = host.check_output(f"systemctl show --property=MainPID --value {unit}")
        assert host.check_output(f"ps -o user= -p {pid}") == "dcu-serving"
        assert "video" in host.check_output(f"ps -o supgrp= -p {pid}").split(",")
        command = host.check_output(f"ps -o args= -p {pid}")
        assert "/opt/vllm/bin/dcu-vllm-sim serve /srv/models/MiniCPM-V-4.5" in command
        environ = host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
        assert f"HIP_VISIBLE_DEVICES={card}" in environ and f"DCU_VLLM_PORT={8002 + card}" in environ
        # The DTK's environment, its libraries before hyhal's (docs/field-evidence.md T3).
        assert "ROCM_PATH=/opt/dtk" in environ and "HIP_PATH=/opt/dtk/hip" in environ
        library_path = next(e for e in environ if e.startswith("LD_LIBRARY_PATH=")).split("=", 1)[1].split(":")
        assert library_path.index("/opt/dtk/lib") < library_path.index("/opt/hyhal/lib")
        for prop, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "User": "dcu-serving"}.items():
            assert host.check_output(f"systemctl show --property={prop} --value {unit}") == value


def _exposure(host, unit: str) -> float:
    """systemd-analyze security's overall exposure of a unit as the node's systemd loaded it (0 best, 10 worst)."""
    out = host.check_output(f"systemd-analyze security {unit} 2>&1 | tail -1")
    return float(out.split("exposure level for", 1)[1].split(":", 1)[1].split()[0])


def test_the_host_runtime_is_walled_in_about_as_well_as_the_proxy_and_still_reaches_its_cards(host):
    """The runtime host's unit scored 7.6 EXPOSED before its walls; the proxy's scores 1.4. The instances serve with
    the walls up (they answered verify's requests), see their DCU nodes and no other device, have no capability,
    cannot write outside their state directory, are capped in tasks and memory, and talk to loopback only."""
    exposure, proxy = _exposure(host, "vllm@0.service"), _exposure(host, "dcu-proxy.service")
    print(f"systemd-analyze security: vllm@0 {exposure}, dcu-proxy {proxy}")
    assert exposure <= 2.0 and proxy <= 2.0, (exposure, proxy)
    expected = {"CapabilityBoundingSet": "", "DevicePolicy": "closed", "ProtectClock": "yes",
                "ProtectProc": "invisible", "RestrictNamespaces": "yes", "TasksMax": "8192",
                "MemoryMax": str(48 * 1024 ** 3)}
    for prop, value in expected.items():
        assert host.check_output(f"systemctl show --property={prop} --value vllm@0") == value, prop
    assert "0.0.0.0/0" in host.check_output("systemctl show --property=IPAddressDeny --value vllm@0")
    allowed = host.check_output("systemctl show --property=DeviceAllow --value vllm@0")
    assert "/dev/kfd rw" in allowed and "char-drm rw" in allowed, allowed
    # The running server: no capability, no new privileges, and a read-only /etc in its own mount namespace.
    pid = host.check_output("systemctl show --property=MainPID --value vllm@0")
    status = dict(line.split(":\t", 1) for line in host.check_output(f"cat /proc/{pid}/status").splitlines()
                  if ":\t" in line)
    assert status["CapEff"].strip() == "0" * 16 and status["NoNewPrivs"].strip() == "1", status
    # Its mounts (/proc/PID/mountinfo: mount point 5th, options 6th): the root read-only, the state directory not.
    mounts = {fields[4]: fields[5].split(",") for fields in
              (line.split() for line in host.check_output(f"cat /proc/{pid}/mountinfo").splitlines())}
    assert "ro" in mounts["/"] and "rw" in mounts["/var/lib/dcu-serving/vllm"], mounts
