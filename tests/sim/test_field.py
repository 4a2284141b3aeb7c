"""Field behaviours of vLLM containers on DCU hosts (docs/simulator.md, "Field behaviours"): the internal
port race on VLLM_PORT, the hub lookups of a host not told it is offline, usage statistics, and the
device checks the image switches on."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from sim.simtools import EMBEDDER, model_dir

from dcu_serving.sim.startup import device_problems, dtk_problems, usage_stats_destination
from support import FAST_SIM, ServerProcess, free_port, http_status, python_module, wait_until

OFFLINE_ERROR = "OSError: We couldn't connect to 'https://huggingface.co' to load the files"


def launch(tmp_path: Path, path: Path, *args: str, env: dict, name: str) -> ServerProcess:
    """A simulator with exactly this environment (nothing inherited that could change the outcome)."""
    port = free_port()
    server = ServerProcess(python_module("dcu_serving.sim", "serve", str(path), "--host", "127.0.0.1",
                                         "--port", str(port), *FAST_SIM, *args),
                           port, log=tmp_path / f"{name}.log")
    server.env = env
    return server


def base_env(**extra: str) -> dict:
    keep = ("PATH", "PYTHONPATH", "HOME", "LANG")
    return {**{k: os.environ[k] for k in keep if k in os.environ}, **extra}


@pytest.fixture
def servers():
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.stop()


def start_all(servers: list, *new: ServerProcess):
    """Start the processes together (the race needs them to probe their ports at the same time)."""
    for server in new:
        servers.append(server)
        server.proc = subprocess.Popen(server.args, stdout=open(server.log, "ab"),  # noqa: SIM115
                                       stderr=subprocess.STDOUT, env=server.env)


def outcome(server: ServerProcess) -> str | int:
    """'serving' once /health answers, else the exit status once it has exited (None meanwhile)."""
    code = server.proc.poll()
    if code is not None:
        return code
    return "serving" if http_status(server.url + "/health") == 200 else None


# --- VLLM_PORT: get_open_port()'s check-then-use race -----------------------------------------------


def test_instances_started_together_with_the_same_vllm_port_collide(tmp_path, servers):
    """Both probe VLLM_PORT before either binds it (the load time is the window), and the second bind fails."""
    path = model_dir(tmp_path, "m", EMBEDDER)
    # The window must outlast the two interpreters' start-up stagger on a loaded machine (CI's was over 3 s:
    # the later one probed after the first had bound, took the next port up, and that was the other's API port).
    a, b = (launch(tmp_path, path, "--sim-load-seconds", "10", env={}, name=n) for n in "ab")
    # Taken after the API ports, so the port above it (where a late prober goes) is nobody's API port.
    internal = str(free_port())
    a.env = b.env = base_env(VLLM_PORT=internal, HF_HUB_OFFLINE="1")
    start_all(servers, a, b)
    results = wait_until(lambda: all(outcome(s) is not None for s in (a, b)) and [outcome(s) for s in (a, b)],
                         60, interval=0.1, what="both instances serving or exited")
    assert sorted(results, key=str) == [1, "serving"], results
    loser = a if results[0] == 1 else b
    log = loser.log.read_text()
    assert "OSError: [Errno 98] Address already in use" in log
    assert f"port: {internal}, useIpv6: false, code: -98, name: EADDRINUSE" in log
    assert "Starting vLLM API server" not in log


def test_distinct_vllm_ports_or_none_at_all_do_not_collide(tmp_path, servers):
    path = model_dir(tmp_path, "m", EMBEDDER)
    first, second = free_port(), free_port()
    distinct = [launch(tmp_path, path, "--sim-load-seconds", "2", name=f"p{port}",
                       env=base_env(VLLM_PORT=str(port), HF_HUB_OFFLINE="1")) for port in (first, second)]
    unset = [launch(tmp_path, path, "--sim-load-seconds", "2", name=f"u{i}", env=base_env(HF_HUB_OFFLINE="1"))
             for i in range(2)]
    start_all(servers, *distinct, *unset)
    wait_until(lambda: [outcome(s) for s in servers] == ["serving"] * 4, 30, interval=0.1,
               what="four instances serving")
    assert f"bound on port {first} (VLLM_PORT={first})" in distinct[0].log.read_text()


def test_a_taken_vllm_port_is_skipped_when_probed(tmp_path, servers):
    path = model_dir(tmp_path, "m", EMBEDDER)
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = launch(tmp_path, path, env=base_env(VLLM_PORT=str(port), HF_HUB_OFFLINE="1"), name="skip")
        start_all(servers, server)
        wait_until(lambda: outcome(server) == "serving", 20, what="serving")
    assert f"Port {port} is already in use, trying port {port + 1}" in server.log.read_text()


def test_vllm_port_is_not_the_api_port(tmp_path):
    """vLLM's docs: VLLM_PORT is for internal use; `--port $VLLM_PORT` does not work (the engine took it)."""
    path = model_dir(tmp_path, "m", EMBEDDER)
    port = str(free_port())
    run = subprocess.run(python_module("dcu_serving.sim", "serve", str(path), "--port", port),
                         env=base_env(VLLM_PORT=port, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=20)
    assert run.returncode == 1
    assert f"[Errno 98] error while attempting to bind on address ('0.0.0.0', {port}): address already in use" \
        in run.stderr


def test_vllm_port_that_looks_like_a_url_is_refused(tmp_path):
    path = model_dir(tmp_path, "m", EMBEDDER)
    run = subprocess.run(python_module("dcu_serving.sim", "serve", str(path), "--port", str(free_port())),
                         env=base_env(VLLM_PORT="tcp://10.0.0.1:5557", HF_HUB_OFFLINE="1"),
                         capture_output=True, text=True, timeout=20)
    assert run.returncode == 1
    assert "VLLM_PORT 'tcp://10.0.0.1:5557' appears to be a URI" in run.stderr


# --- offline -------------------------------------------------------------------------------------


def test_without_hf_hub_offline_a_missing_tokenizer_fails_like_an_air_gapped_hub_lookup(tmp_path, servers):
    path = model_dir(tmp_path, "no-tokenizer", EMBEDDER, tokenizer=False)
    online = subprocess.run(python_module("dcu_serving.sim", "serve", str(path), "--port", str(free_port())),
                            env=base_env(), capture_output=True, text=True, timeout=20)
    assert online.returncode == 1
    assert OFFLINE_ERROR in online.stderr and "Starting vLLM API server" not in online.stderr

    offline = launch(tmp_path, path, env=base_env(HF_HUB_OFFLINE="1"), name="offline")
    skipped = launch(tmp_path, path, "--skip-tokenizer-init", env=base_env(), name="skip")
    start_all(servers, offline, skipped)
    wait_until(lambda: [outcome(s) for s in (offline, skipped)] == ["serving"] * 2, 20, what="both serving")
    assert "a real vLLM would fail to load the tokenizer here" in offline.log.read_text()

    with_tokenizer = model_dir(tmp_path, "with-tokenizer", EMBEDDER)
    online_ok = launch(tmp_path, with_tokenizer, env=base_env(), name="online")
    start_all(servers, online_ok)
    wait_until(lambda: outcome(online_ok) == "serving", 20, what="serving")


def test_usage_statistics_are_reported_at_start(tmp_path, servers):
    path = model_dir(tmp_path, "m", EMBEDDER)
    on = launch(tmp_path, path, env=base_env(), name="on")
    off = launch(tmp_path, path, env=base_env(DO_NOT_TRACK="1"), name="off")
    start_all(servers, on, off)
    wait_until(lambda: [outcome(s) for s in (on, off)] == ["serving"] * 2, 20, what="both serving")
    assert "a real vLLM would post them to https://stats.vllm.ai" in on.log.read_text()
    assert "usage statistics: off" in off.log.read_text()


@pytest.mark.parametrize("env, destination", [
    ({}, "https://stats.vllm.ai"),
    ({"VLLM_USAGE_STATS_SERVER": "http://stats.local"}, "http://stats.local"),
    ({"VLLM_NO_USAGE_STATS": "1"}, None),
    ({"DO_NOT_TRACK": "1"}, None),
    ({"DO_NOT_TRACK": "true"}, "https://stats.vllm.ai"),  # only "1" counts
    ({"VLLM_DO_NOT_TRACK": "0", "DO_NOT_TRACK": "1"}, "https://stats.vllm.ai"),  # the first one set wins
])
def test_usage_statistics_switches_read_like_vllm(tmp_path, env, destination):
    assert usage_stats_destination(env, home=tmp_path) == destination


def test_a_do_not_track_file_switches_usage_statistics_off(tmp_path):
    (tmp_path / ".config/vllm").mkdir(parents=True)
    (tmp_path / ".config/vllm/do_not_track").touch()
    assert usage_stats_destination({}, home=tmp_path) is None


# --- device checks (on in the image) --------------------------------------------------------------


@pytest.fixture
def host(tmp_path) -> dict:
    """A container's view, in a temporary directory: device nodes, hyhal, /proc/self/status."""
    (tmp_path / "dev/dri").mkdir(parents=True)
    (tmp_path / "dev/kfd").touch()
    (tmp_path / "dev/dri/renderD128").touch()
    (tmp_path / "opt/hyhal/lib").mkdir(parents=True)
    (tmp_path / "opt/hyhal/lib/librocm_smi64.so.2").touch()
    (tmp_path / "status").write_text("Name:\tvllm\nSeccomp:\t0\nSeccomp_filters:\t0\n")
    return {"kfd": str(tmp_path / "dev/kfd"), "dri": str(tmp_path / "dev/dri"), "hyhal": str(tmp_path / "opt/hyhal"),
            "status": str(tmp_path / "status")}


def test_a_container_with_everything_passes(host):
    assert device_problems(**host) == []


def test_no_kfd_is_no_hip_device(host):
    os.remove(host["kfd"])
    [problem] = device_problems(**host)
    assert "hipErrorNoDevice: no ROCm-capable device is detected" in problem and "--device=/dev/kfd" in problem


def test_no_render_node_is_no_hip_device(host):
    os.remove(host["dri"] + "/renderD128")
    assert "hipErrorNoDevice" in device_problems(**host)[0]


def test_hyhal_not_mounted(host):
    os.remove(host["hyhal"] + "/lib/librocm_smi64.so.2")
    [problem] = device_problems(**host)
    assert "DEVCOUNT=0: hy-smi sees no device" in problem and "-v /opt/hyhal:/opt/hyhal:ro" in problem
    assert device_problems(**host, hyhal_from_host=False) == []  # an image with its own hyhal


def test_docker_default_seccomp_filter(host):
    Path(host["status"]).write_text("Name:\tvllm\nSeccomp:\t2\nSeccomp_filters:\t1\n")
    [problem] = device_problems(**host)
    assert "failed to check docker container" in problem and "--security-opt seccomp=unconfined" in problem


@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="this host has a DCU runtime device")
def test_device_checks_are_off_unless_switched_on(tmp_path, servers):
    path = model_dir(tmp_path, "m", EMBEDDER)
    checked = subprocess.run(python_module("dcu_serving.sim", "serve", str(path), "--port", str(free_port())),
                             env=base_env(DCU_SIM_DEVICE_CHECKS="1"), capture_output=True, text=True, timeout=20)
    assert checked.returncode == 1 and "hipErrorNoDevice" in checked.stderr
    unchecked = launch(tmp_path, path, env=base_env(), name="unchecked")
    start_all(servers, unchecked)
    wait_until(lambda: outcome(unchecked) == "serving", 20, what="serving without device checks")


def test_an_image_with_its_own_dtk_starts_only_in_the_dtks_environment():
    # Hygon's images carry /opt/dtk; vLLM is started after `source /opt/dtk/env.sh` unless ENV holds it (C8).
    [problem] = dtk_problems({"DCU_SIM_DTK": "image"})
    assert problem.startswith("ImportError: libgalaxyhip.so.5: cannot open shared object file")
    assert "source /opt/dtk/env.sh" in problem
    assert dtk_problems({"DCU_SIM_DTK": "image", "ROCM_PATH": "/opt/dtk"}) == []
    assert dtk_problems({}) == [], "the simulator outside its image has no DTK to miss"
