"""dcu-benchmark against real simulators behind a real dcu-proxy: the knee is where the capacity is.

Two simulators with --max-num-seqs S serve C x S = 2S requests at once; beyond that, callers wait in the
proxy's queue and throughput stays flat. The knee dcu-benchmark finds must land there, and move up when S
doubles. "There" counts callers, not slots: between an answer and its next request each caller holds no slot
(aiperf reads the stream, builds the next request), so 2S slots fill at 2S x cycle / latency callers, where
the cycle (callers / throughput) and the latency are measured at the lowest level. On a slow machine that
gap is a tenth to a fifth of the latency, and the knee is that much above 2S (seen on 2026-12-06: 9.73 for 8
slots, 18.5-18.9 for 16).

aiperf runs for real, offline: DCU_AIPERF names the aiperf executable of a venv that also holds dcu-serving
(its dcu-benchmark script sits beside it); `make loadgen` builds one. Without it these tests fail, they do not
skip: a capacity check that silently does not run is no check.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from support import SERVED_MODEL, free_port

pytestmark = pytest.mark.loadgen

CARDS = 2
# Every request takes the same time: TTFT 50 ms (+ the image's 30 ms), then 12 tokens 20 ms apart (the answer
# is longer than 12, so max_tokens cuts it). ~0.33 s per request; streamed tokens stay few enough for 2 cores.
SIM_TIMING = ("--sim-ttft-ms", "50", "--sim-itl-ms", "20", "--sim-itl-jitter", "0",
              "--sim-think-tokens", "0", "--sim-answer-tokens", "40")
WORKLOAD = ("--image-width", "256", "--image-height", "192", "--output-tokens", "12", "--stream")
# Any attempt to reach the internet (the hub, tiktoken's download) goes to a closed local port and fails.
NO_INTERNET = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
               "NO_PROXY": "127.0.0.1,localhost", "HF_ENDPOINT": "http://127.0.0.1:9"}


@pytest.fixture(scope="module")
def benchmark() -> str:
    """The dcu-benchmark of the load-generator venv."""
    aiperf = os.environ.get("DCU_AIPERF")
    hint = ("`make loadgen` builds the load-generator venv (build/loadgen-venv: aiperf and dcu-serving) and "
            "DCU_AIPERF=build/loadgen-venv/bin/aiperf points the tests at it")
    if not aiperf:
        pytest.fail(f"DCU_AIPERF is not set: {hint}")
    script = Path(aiperf).with_name("dcu-benchmark")
    for path in (Path(aiperf), script):
        if not (path.is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"DCU_AIPERF={aiperf}: {path} is not an executable: {hint}")
    return str(script)


def run_benchmark(benchmark: str, url: str, out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **NO_INTERNET}
    env.pop("PYTHONPATH", None)  # the venv's own dcu-serving, as an operator runs it
    return subprocess.run([benchmark, "--url", url, "--model", SERVED_MODEL, "--out", str(out), *WORKLOAD, *args],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def measure(benchmark, start_sim, start_proxy, tmp_path: Path, seqs: int, levels: str, requests: int) -> dict:
    sims = [start_sim(*SIM_TIMING, "--max-num-seqs", str(seqs), wait=False) for _ in range(CARDS)]
    for sim in sims:  # started together, waited for together
        sim.wait_ready()
    # the proxy's cap per backend follows the instances' max-num-seqs, as the dcu_proxy role derives it
    proxy = start_proxy([s.url for s in sims], healthy=CARDS, backend_concurrency=seqs,
                        health={"interval": 0.5, "timeout": 0.4})
    out = tmp_path / f"seqs{seqs}"
    began = time.monotonic()
    done = run_benchmark(benchmark, proxy.url, out, "--concurrency", levels, "--requests-per-level", str(requests),
                         "--label", f"{CARDS} simulators x max-num-seqs {seqs}")
    print(f"max-num-seqs {seqs}: dcu-benchmark took {time.monotonic() - began:.1f} s\n{done.stdout}")
    assert done.returncode == 0, done.stdout + done.stderr
    for server in (proxy, *sims):  # free the cores for what follows
        server.stop()
    return json.loads((out / "results.json").read_text()) | {"out": out}


def test_the_knee_is_the_capacity_and_moves_with_it(benchmark, start_sim, start_proxy, tmp_path):
    small = measure(benchmark, start_sim, start_proxy, tmp_path, seqs=4, levels="4,8,12,16", requests=48)
    large = measure(benchmark, start_sim, start_proxy, tmp_path, seqs=8, levels="8,16,24,32", requests=96)

    for results, capacity in ((small, CARDS * 4), (large, CARDS * 8)):
        knee = results["knee"]["concurrency"]
        assert knee is not None, results["knee"]
        curve = [(lv["concurrency"], lv["request_throughput_rps"]) for lv in results["levels"]]
        low = min(results["levels"], key=lambda lv: lv["concurrency"])
        cycle = low["concurrency"] / low["request_throughput_rps"]
        callers = capacity * cycle / (low["latency_p50_ms"] / 1000)  # the callers that keep every slot busy
        assert 0.95 * capacity <= callers <= 1.5 * capacity, (capacity, cycle, low["latency_p50_ms"])
        assert abs(knee - callers) <= 0.15 * callers, \
            f"knee {knee} for {capacity} slots, filled by {callers:.2f} callers: {curve}"
        # every level ran, every request succeeded, and the numbers are aiperf's
        assert [lv["concurrency"] for lv in results["levels"]] == results["settings"]["levels"]
        for level in results["levels"]:
            assert level["errors"] == 0 and level["requests"] >= 48, level
            for field in ("request_throughput_rps", "output_token_throughput_tps", "ttft_p50_ms", "ttft_p99_ms",
                          "itl_p50_ms", "itl_p99_ms", "latency_p50_ms", "latency_p99_ms"):
                assert level[field] is not None and level[field] > 0, (field, level)
            assert (results["out"] / "raw" / f"c{level['concurrency']}" / "profile_export_aiperf.json").is_file()
        settings = results["settings"]
        assert settings["model"] == SERVED_MODEL and settings["aiperf_version"] == "0.13.0"
        assert settings["workload"]["output_tokens"] == 12 and results["started"] <= results["finished"]
        html = (results["out"] / "report.html").read_text()
        assert f"Knee: <b>{knee:.1f}</b>" in html and html.count("data:image/png;base64,") == 3
        assert all((results["out"] / name).stat().st_size > 0 for name in ("throughput.png", "ttft.png", "itl.png"))
    assert large["knee"]["concurrency"] > small["knee"]["concurrency"] * 1.5


def test_an_unreachable_target_is_refused_at_once(benchmark, tmp_path):
    done = run_benchmark(benchmark, f"http://127.0.0.1:{free_port()}", tmp_path / "out", "--concurrency", "1,2")
    assert done.returncode == 2
    assert "dcu-benchmark: cannot reach http://127.0.0.1:" in done.stderr
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_level_where_every_request_fails_stops_the_run(benchmark, start_sim, start_proxy, tmp_path):
    sim = start_sim(*SIM_TIMING, "--sim-fault", "error:status=400")
    proxy = start_proxy([sim.url], healthy=1)
    done = run_benchmark(benchmark, proxy.url, tmp_path / "out", "--concurrency", "1,2", "--requests-per-level", "4")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "every request failed at concurrency 1" in done.stderr
    assert "Simulated engine failure" in done.stderr  # what the server said, not only that it failed
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    [level] = results["levels"]  # the run stopped there
    assert level["requests"] == 0 and level["errors"] == 4
