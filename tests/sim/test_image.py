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


@pytest.fixture(scope="module")
def tarball() -> Path:
    built = subprocess.run([str(REPO / "tools/build-sim-image")], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    return Path(built.stdout.strip())


@pytest.fixture
def container():
    """docker run the image (detached, host network); every container is removed afterwards."""
    names = []

    def run(*args: str, volumes: dict | None = None) -> str:
        name = f"dcu-sim-test-{uuid.uuid4().hex[:8]}"
        mounts = [a for host, inside in (volumes or {}).items() for a in ("-v", f"{host}:{inside}:ro")]
        subprocess.run(["docker", "run", "-d", "--name", name, "--network", "host", *mounts, TAG, *args],
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


def test_vllm_serve_in_the_image_answers_models_and_completions(tarball, container, tmp_path):
    model = tmp_path / "x"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["MiniCPMV"]}')
    port = free_port()
    name = container("vllm", "serve", "/models/x", "--port", str(port), "--served-model-name", SERVED_MODEL,
                     "--gpu-memory-utilization", "0.9", "--trust-remote-code", "--sim-itl-ms", "1",
                     volumes={model: "/models/x"})
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
