"""The emulated driver's counters (tools/images/node/files/dcuemu.py, run by dcu-emu-activity every second):
each card's busy percent follows the running sequences of the vLLM server holding it, and its VRAM used is the
share that server took at start. A real simulator serves; docker's record of a container names its card."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import requests

from support import FAST_SIM, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "images" / "node" / "files"))
import dcuemu  # the node image's module, put on the path above

CARDS = ["0000:07:00.0", "0000:0a:00.0"]
TOTAL = 64 * 1024**3


def emulated_sysfs(root: Path) -> Path:
    """Two bound cards with render nodes renderD128 and renderD129, as the emulated modprobe leaves them."""
    for position, bdf in enumerate(CARDS):
        device = root / "bus/pci/devices" / bdf
        device.mkdir(parents=True)
        (device / "mem_info_vram_total").write_text(f"{TOTAL}\n")
        (device / "mem_info_vram_used").write_text(f"{dcuemu.IDLE_VRAM}\n")
        node = root / "class/drm" / f"renderD{128 + position}"
        node.mkdir(parents=True)
        (node / "device").symlink_to(device)
    return root


def container(docker: Path, pid: int, render_node: str, env: list | None = None):
    """docker's on-disk record of a running container given one render node (what `docker run --device` leaves)."""
    record = docker / "containers" / f"c{pid}"
    record.mkdir(parents=True)
    (record / "config.v2.json").write_text(json.dumps({"State": {"Running": True, "Pid": pid},
                                                       "Config": {"Env": env or ["PATH=/usr/bin"]}}))
    (record / "hostconfig.json").write_text(json.dumps({"Devices": [
        {"PathOnHost": render_node, "PathInContainer": "/dev/dri/renderD128", "CgroupPermissions": "rwm"}]}))


def counters(root: Path, bdf: str) -> tuple[int, float]:
    """(busy percent, VRAM used as a share of the card's, to 3 places)."""
    device = root / "bus/pci/devices" / bdf
    used = int((device / "mem_info_vram_used").read_text())
    return int((device / "gpu_busy_percent").read_text()), round(used / TOTAL, 3)


def test_busy_follows_the_running_sequences_and_vram_is_the_share_taken_at_start(tmp_path, start_sim):
    root = emulated_sysfs(tmp_path / "sys")
    sim = start_sim("--sim-ttft-ms", "5", "--sim-itl-ms", "50", "--sim-answer-tokens", "60",
                    "--max-num-seqs", "4", "--gpu-memory-utilization", "0.85")
    container(tmp_path / "docker", sim.proc.pid, "/dev/dri/renderD129")
    users = dcuemu.card_users(root, docker_root=tmp_path / "docker", proc=tmp_path / "no-proc")
    assert users == {sim.proc.pid: ([CARDS[1]], users[sim.proc.pid][1])} and "--port" in users[sim.proc.pid][1]

    dcuemu.update_activity(root, users)
    assert counters(root, CARDS[1]) == (0, 0.85)  # loaded, idle: vLLM holds its share from the start
    assert counters(root, CARDS[0]) == (0, round(dcuemu.IDLE_VRAM / TOTAL, 3))

    body = {"model": "MiniCPM-V-4.5", "max_tokens": 60, "messages": [{"role": "user", "content": "hi"}],
            "chat_template_kwargs": {"enable_thinking": False}}
    callers = [threading.Thread(target=requests.post, args=(sim.url + "/v1/chat/completions",),
                                kwargs={"json": body, "timeout": 60}) for _ in range(2)]
    for caller in callers:
        caller.start()

    def busy():
        dcuemu.update_activity(root, users)
        return counters(root, CARDS[1])[0] == 50  # 2 running of --max-num-seqs 4
    wait_until(busy, 10, interval=0.05, what="card 1 at 50 % with 2 of 4 sequences running")
    assert counters(root, CARDS[0])[0] == 0
    for caller in callers:
        caller.join()
    dcuemu.update_activity(root, users)
    assert counters(root, CARDS[1]) == (0, 0.85)


def test_a_stopped_server_leaves_its_card_idle(tmp_path, start_sim):
    root = emulated_sysfs(tmp_path / "sys")
    sim = start_sim(*FAST_SIM)
    container(tmp_path / "docker", sim.proc.pid, "/dev/dri/renderD128")
    users = dcuemu.card_users(root, docker_root=tmp_path / "docker", proc=tmp_path / "no-proc")
    dcuemu.update_activity(root, users)
    assert counters(root, CARDS[0]) == (0, 0.9)  # vLLM's default --gpu-memory-utilization
    sim.stop()
    (tmp_path / "docker" / "containers" / f"c{sim.proc.pid}" / "config.v2.json").write_text(
        json.dumps({"State": {"Running": False, "Pid": 0}}))
    dcuemu.update_activity(root, dcuemu.card_users(root, docker_root=tmp_path / "docker", proc=tmp_path / "no-proc"))
    assert counters(root, CARDS[0]) == (0, round(dcuemu.IDLE_VRAM / TOTAL, 3))
