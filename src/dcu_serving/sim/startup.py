"""What happens between `vllm serve` and the first byte it listens with, on real DCU hosts.

Each behaviour reproduces a failure seen in the field (docs/simulator.md, "Field behaviours"):
the hub lookups of a host that is not told it is offline, vLLM's internal port taken with a
check-then-use race when several instances share VLLM_PORT, and the device checks of a container
that lacks /dev/kfd, the host's hyhal, or runs under Docker's default seccomp filter.
"""

from __future__ import annotations

import glob
import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from dcu_serving.sim.model import StartupError, has_tokenizer

log = logging.getLogger("dcu_serving.sim")

HF_HUB = "https://huggingface.co"
USAGE_STATS_SERVER = "https://stats.vllm.ai"


# --- the hub and usage statistics ----------------------------------------------------------------

def check_offline(model_path: Path, tokenizer_path: Path | None, skip_tokenizer: bool, env=os.environ):
    """Without HF_HUB_OFFLINE=1, a file the model directory lacks is looked up on the hub; air-gapped, that fails.

    The simulator takes a missing tokenizer as the file that must come from the hub, and fails with the
    error transformers raises when it can neither reach the hub nor find the file in its cache.
    """
    path = tokenizer_path or model_path
    if skip_tokenizer or has_tokenizer(path):
        return
    if env.get("HF_HUB_OFFLINE") != "1":
        raise StartupError(
            f"{path} has no tokenizer file (tokenizer.json, tokenizer_config.json, ...); with HF_HUB_OFFLINE "
            f"unset, transformers asks {HF_HUB} for it, and this host cannot reach it",
            f"OSError: We couldn't connect to '{HF_HUB}' to load the files, and couldn't find them in the "
            "cached files.\nCheck your internet connection or see how to run the library in offline mode at "
            f"'{HF_HUB}/docs/transformers/installation#offline-mode'.")
    log.warning("%s has no tokenizer file: a real vLLM would fail to load the tokenizer here (copy the "
                "tokenizer files with the weights, or pass --skip-tokenizer-init); the simulator needs none",
                path)


def usage_stats_destination(env=os.environ, home: Path | None = None) -> str | None:
    """Where vLLM would post usage statistics, or None when they are switched off (vllm/usage/usage_lib.py)."""
    # envs.py: VLLM_DO_NOT_TRACK is (VLLM_DO_NOT_TRACK or DO_NOT_TRACK or "0") == "1"; the first one set wins.
    do_not_track = (env.get("VLLM_DO_NOT_TRACK") or env.get("DO_NOT_TRACK") or "0") == "1"
    no_usage_stats = env.get("VLLM_NO_USAGE_STATS", "0") == "1"
    home = home or Path(env.get("HOME") or Path.home())
    if do_not_track or no_usage_stats or (home / ".config/vllm/do_not_track").exists():
        return None
    return env.get("VLLM_USAGE_STATS_SERVER") or USAGE_STATS_SERVER


def log_usage_stats(env=os.environ):
    destination = usage_stats_destination(env)
    if destination is None:
        log.info("usage statistics: off (VLLM_NO_USAGE_STATS / DO_NOT_TRACK / ~/.config/vllm/do_not_track)")
    else:
        log.warning("usage statistics: a real vLLM would post them to %s now and every 10 minutes (the simulator "
                    "sends nothing); set VLLM_NO_USAGE_STATS=1 or DO_NOT_TRACK=1 on an air-gapped host",
                    destination)


# --- vLLM's internal port (torch.distributed's TCPStore) ------------------------------------------

def vllm_port(env=os.environ) -> int | None:
    """envs.get_vllm_port(): VLLM_PORT as an integer, None when unset."""
    if "VLLM_PORT" not in env:
        return None
    raw = env["VLLM_PORT"]
    try:
        return int(raw)
    except ValueError:
        if urlparse(raw).scheme:
            raise StartupError(
                f"ValueError: VLLM_PORT '{raw}' appears to be a URI. This may be caused by a Kubernetes service "
                "discovery issue, check the warning in: https://docs.vllm.ai/en/stable/serving/env_vars.html"
            ) from None
        raise StartupError(f"ValueError: VLLM_PORT '{raw}' must be a valid integer") from None


def get_open_port(base: int | None) -> int:
    """vllm.utils.get_open_port(): the first port from VLLM_PORT up that can be bound, then released.

    Released: it is bound again later, when the engine initialises torch.distributed. Two instances that
    probe from the same VLLM_PORT before either binds pick the same port (a check-then-use race).
    """
    if base is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return s.getsockname()[1]
    port = base
    while True:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", port))
                return port
        except OSError:
            port += 1
            log.info("Port %d is already in use, trying port %d", port - 1, port)


def bind_internal_port(port: int) -> socket.socket:
    """torch.distributed's TCPStore binds the port get_open_port() chose; held for the life of the server."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("", port))
        s.listen()
    except OSError as e:
        s.close()
        raise StartupError(
            "EngineCore failed to start.",
            f"torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            f"address. port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
            f"OSError: {e}") from None
    return s


# --- the devices a DCU container needs ------------------------------------------------------------

def device_problems(kfd: str = "/dev/kfd", dri: str = "/dev/dri", hyhal: str = "/opt/hyhal",
                    status: str = "/proc/self/status", hyhal_from_host: bool = True) -> list[str]:
    """What stops the DCU runtime in this container, in the order it would trip over it (empty: nothing)."""
    try:
        os.close(os.open(kfd, os.O_RDWR))
        renders = glob.glob(os.path.join(dri, "renderD*"))
        if not renders:
            raise FileNotFoundError(f"no render node in {dri}")
    except OSError as e:
        return [f"RuntimeError: No HIP GPUs are available (hipErrorNoDevice: no ROCm-capable device is detected): "
                f"cannot open the DCU through {kfd} and {dri}/renderD* ({e}). Pass the devices to the container: "
                "--device=/dev/kfd --device=/dev/mkfd --device=/dev/dri/cardN --device=/dev/dri/renderDM"]
    if hyhal_from_host and not glob.glob(os.path.join(hyhal, "lib", "librocm_smi64.so*")):
        return [f"ImportError: librocm_smi64.so.2: cannot open shared object file: No such file or directory "
                f"(DEVCOUNT=0: hy-smi sees no device: the host's hyhal is not mounted at {hyhal}; "
                f"mount it: -v /opt/hyhal:/opt/hyhal:ro)"]
    try:
        seccomp = next((line.split(":", 1)[1].strip() for line in Path(status).read_text().splitlines()
                        if line.startswith("Seccomp:")), "0")
    except OSError:
        seccomp = "0"
    if seccomp == "2":
        return ["hy-smi: failed to check docker container (Docker's default seccomp filter is active: "
                "Seccomp: 2 in /proc/self/status); run the container with --security-opt seccomp=unconfined"]
    return []


def dtk_problems(env=os.environ) -> list[str]:
    """An image with its own DTK (DCU_SIM_DTK=image) whose ENV does not hold the DTK's environment: vLLM starts only
    after `source /opt/dtk/env.sh` (ROCM_PATH, the DTK's libraries on LD_LIBRARY_PATH); without it the HIP
    libraries are not found (docs/field-evidence.md C8)."""
    if env.get("DCU_SIM_DTK") != "image" or env.get("ROCM_PATH"):
        return []
    return ["ImportError: libgalaxyhip.so.5: cannot open shared object file: No such file or directory (the DTK's "
            "environment is not set: ROCM_PATH is empty; start vLLM after `source /opt/dtk/env.sh`, as Hygon's "
            "recipes do)"]


def check_devices(env=os.environ):
    """DCU_SIM_DEVICE_CHECKS=1 (set in the image): refuse to start where the real runtime would fail."""
    if env.get("DCU_SIM_DEVICE_CHECKS", "0") != "1":
        return
    problems = dtk_problems(env) or device_problems(hyhal_from_host=env.get("DCU_SIM_HYHAL", "host") == "host")
    if problems:
        raise StartupError(*problems)
