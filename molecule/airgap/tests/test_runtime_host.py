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
