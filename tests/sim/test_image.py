"""The simulator image: built offline by tools/build-sim-image, `vllm serve ...` answers like vLLM."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
import requests

from support import REPO, SERVED_MODEL, free_port, http_status, wait_until

pytestmark = pytest.mark.docker
TAG = "dcu-serving/vllm-sim:0.11.0"
# What a DCU container is given (the image checks for them): a card's nodes (here /dev/null stands in),
# and no Docker default seccomp filter. The host's hyhal is mounted by the `hyhal` fixture.
DEVICES = ("--device", "/dev/null:/dev/kfd", "--device", "/dev/null:/dev/dri/renderD128")
UNCONFINED = ("--security-opt", "seccomp=unconfined")
# The DTK's environment, as `source /opt/dtk/env.sh` (what vllm@.service does) or an image's ENV sets it.
DTK_ENV = ("-e", "ROCM_PATH=/opt/dtk")


@pytest.fixture(scope="module")
def tarball() -> Path:
    built = subprocess.run([str(REPO / "tools/build-sim-image")], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    return Path(built.stdout.strip())


@pytest.fixture
def hyhal(tmp_path) -> Path:
    """The host's /opt/hyhal as the image needs it mounted (its rocm_smi library)."""
    (tmp_path / "hyhal/lib").mkdir(parents=True)
    (tmp_path / "hyhal/lib/librocm_smi64.so.2").write_bytes(b"stub")
    return tmp_path / "hyhal"


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "x"
    path.mkdir()
    (path / "config.json").write_text('{"architectures": ["MiniCPMV"]}')
    (path / "tokenizer_config.json").write_text("{}")
    return path


@pytest.fixture
def container():
    """docker run the image (detached, host network); every container is removed afterwards."""
    names = []

    def run(*args: str, volumes: dict | None = None, options: tuple = ()) -> str:
        name = f"dcu-sim-test-{uuid.uuid4().hex[:8]}"
        mounts = [a for host, inside in (volumes or {}).items() for a in ("-v", f"{host}:{inside}:ro")]
        subprocess.run(["docker", "run", "-d", "--name", name, "--network", "host", *options, *mounts, TAG, *args],
                       check=True, capture_output=True, timeout=60)
        names.append(name)
        return name

    yield run
    for name in names:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


def test_tarball_holds_the_tagged_image_and_its_checksum(tarball):
    assert tarball == REPO / "build/images/vllm-sim-0.11.0.tar"
    recorded = (tarball.parent / (tarball.name + ".sha256")).read_text().split()
    with tarball.open("rb") as f:
        assert recorded == [hashlib.file_digest(f, "sha256").hexdigest(), tarball.name]
    with tarfile.open(tarball) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    assert manifest[0]["RepoTags"] == [TAG]


def test_second_build_is_cached(tarball):
    again = subprocess.run([str(REPO / "tools/build-sim-image")], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0
    assert "is up to date" in again.stderr
    assert again.stdout.strip() == str(tarball)


def test_vllm_serve_in_the_image_answers_models_and_completions(tarball, container, model, hyhal):
    port = free_port()
    name = container("vllm", "serve", "/models/x", "--port", str(port), "--served-model-name", SERVED_MODEL,
                     "--gpu-memory-utilization", "0.9", "--trust-remote-code", "--sim-itl-ms", "1",
                     volumes={model: "/models/x", hyhal: "/opt/hyhal"}, options=(*DEVICES, *UNCONFINED, *DTK_ENV))
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_status(url + "/v1/models") == 200, 30, what="simulator in the container")
    [card] = requests.get(url + "/v1/models", timeout=5).json()["data"]
    assert (card["id"], card["root"]) == (SERVED_MODEL, "/models/x")
    reply = requests.post(url + "/v1/chat/completions", timeout=30, json={
        "model": SERVED_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).json()
    assert reply["choices"][0]["finish_reason"] == "length"
    user = subprocess.run(["docker", "exec", name, "id", "-u"], capture_output=True, text=True, timeout=30)
    assert user.stdout.strip() == "65534"  # not root inside the container
    logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=30).stderr
    assert "ignoring vLLM flags the simulator has no use for: --gpu-memory-utilization 0.9" in logs


def test_without_the_model_directory_the_container_exits_with_the_reason(tarball):
    run = subprocess.run(["docker", "run", "--rm", "--name", f"dcu-sim-test-{uuid.uuid4().hex[:8]}", TAG,
                          "vllm", "serve", "/models/missing", "--port", str(free_port())],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "/models/missing is not a directory" in run.stderr


def run_to_exit(*options: str, volumes: dict) -> subprocess.CompletedProcess:
    mounts = [a for host, inside in volumes.items() for a in ("-v", f"{host}:{inside}:ro")]
    return subprocess.run(["docker", "run", "--rm", "--name", f"dcu-sim-test-{uuid.uuid4().hex[:8]}", *options,
                           *mounts, TAG, "vllm", "serve", "/models/x", "--port", str(free_port())],
                          capture_output=True, text=True, timeout=60)


def test_the_image_refuses_to_start_where_a_dcu_runtime_would_fail(tarball, model, hyhal):
    no_dtk_env = run_to_exit(*DEVICES, *UNCONFINED, volumes={model: "/models/x", hyhal: "/opt/hyhal"})
    assert no_dtk_env.returncode == 1 and "libgalaxyhip.so.5: cannot open shared object file" in no_dtk_env.stderr
    assert "source /opt/dtk/env.sh" in no_dtk_env.stderr
    no_devices = run_to_exit(*UNCONFINED, *DTK_ENV, volumes={model: "/models/x", hyhal: "/opt/hyhal"})
    assert no_devices.returncode == 1 and "hipErrorNoDevice" in no_devices.stderr
    no_hyhal = run_to_exit(*DEVICES, *UNCONFINED, *DTK_ENV, volumes={model: "/models/x"})
    assert no_hyhal.returncode == 1 and "DEVCOUNT=0" in no_hyhal.stderr
    assert "-v /opt/hyhal:/opt/hyhal:ro" in no_hyhal.stderr
    default_seccomp = run_to_exit(*DEVICES, *DTK_ENV, volumes={model: "/models/x", hyhal: "/opt/hyhal"})
    assert default_seccomp.returncode == 1 and "failed to check docker container" in default_seccomp.stderr
    assert "--security-opt seccomp=unconfined" in default_seccomp.stderr


def test_device_checks_can_be_switched_off(tarball, container, model):
    port = free_port()
    container("vllm", "serve", "/models/x", "--port", str(port), volumes={model: "/models/x"},
              options=("-e", "DCU_SIM_DEVICE_CHECKS=0"))
    wait_until(lambda: http_status(f"http://127.0.0.1:{port}/health") == 200, 30, what="simulator in the container")


def test_the_image_carries_its_own_dtk_and_serves_once_its_env_is_sourced(tarball, container, model, hyhal):
    """Hygon's recipe, as vllm@.service runs it: the image's own /opt/dtk, sourced before `vllm serve`."""
    port = free_port()
    container("/bin/sh", "-c", '[ -n "${ROCM_PATH:-}" ] || . /opt/dtk/env.sh; exec "$0" "$@"',
              "vllm", "serve", "/models/x", "--port", str(port),
              volumes={model: "/models/x", hyhal: "/opt/hyhal"}, options=(*DEVICES, *UNCONFINED))
    wait_until(lambda: http_status(f"http://127.0.0.1:{port}/health") == 200, 30, what="simulator in the container")
    inspect = json.loads(subprocess.run(["docker", "image", "inspect", TAG], capture_output=True, text=True,
                                        timeout=30, check=True).stdout)[0]
    assert inspect["Config"]["Labels"]["dcu-serving.runtime"] == "image"
    assert not any(e.startswith("ROCM_PATH=") for e in inspect["Config"]["Env"]), "the awkward case: sourced, not set"
