"""The knee fit and the reading of aiperf's export files: pure logic, no aiperf needed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dcu_serving.capacity.knee import find_knee
from dcu_serving.capacity.loadgen import parse_export

SAMPLES = Path(__file__).parent / "samples"


def saturating(slots: float, per_caller: float, levels: list[float], noise: list[float] | None = None):
    """Throughput of a server with `slots` slots: per_caller x C below them, flat above."""
    noise = noise or [0.0] * len(levels)
    return [(c, per_caller * min(c, slots) * (1 + n)) for c, n in zip(levels, noise, strict=True)]


def test_a_saturating_curve_has_its_knee_at_the_slots():
    knee = find_knee(saturating(8, 3.3, [1, 2, 4, 8, 12, 16, 24]))
    assert knee.concurrency == pytest.approx(8)
    assert knee.plateau == pytest.approx(26.4)
    assert knee.slope == pytest.approx(3.3)


def test_the_knee_between_two_levels_is_where_the_lines_meet():
    # 12 slots, measured at 4, 8, 16, 32: no level sits on the knee
    knee = find_knee(saturating(12, 2.0, [4, 8, 16, 32]))
    assert knee.concurrency == pytest.approx(12)
    assert knee.rising == [4, 8] and knee.flat == [16, 32]


def test_noise_moves_the_knee_a_little():
    knee = find_knee(saturating(16, 3.0, [4, 8, 16, 24, 32], noise=[0.02, -0.03, -0.04, 0.01, -0.02]))
    assert knee.concurrency == pytest.approx(16, rel=0.1)


def test_a_curve_still_rising_has_no_knee():
    knee = find_knee([(c, 3.0 * c) for c in (1, 2, 4, 8, 16)])
    assert knee.concurrency is None
    assert "beyond the sweep" in knee.reason


def test_a_curve_that_bends_but_keeps_climbing_has_no_knee():
    # half the low-load rate per caller after 8: not saturated
    knee = find_knee([(c, 2.0 * c if c <= 8 else 16 + 1.0 * (c - 8)) for c in (2, 4, 8, 16, 32)])
    assert knee.concurrency is None


@pytest.mark.parametrize("points", [[], [(4, 10.0)], [(4, 10.0), (8, 20.0)]])
def test_too_few_levels_have_no_knee(points):
    knee = find_knee(points)
    assert knee.concurrency is None
    assert "need at least 3" in knee.reason


def test_the_knee_as_results_json_has_it():
    data = find_knee(saturating(8, 3.3, [2, 4, 8, 16])).as_dict()
    assert data["concurrency"] == 8.0
    assert data["rising_levels"] == [2.0, 4.0] and data["flat_levels"] == [8.0, 16.0]
    assert "definition" in data


def test_a_level_is_read_from_aiperfs_summary(tmp_path):
    level = parse_export(SAMPLES / "c8", 8)
    assert level["concurrency"] == 8
    assert level["requests"] == 48 and level["errors"] == 0
    assert level["request_throughput_rps"] == pytest.approx(23.9158, rel=1e-4)
    assert level["output_token_throughput_tps"] > 0
    # aiperf's own percentiles, as it exported them (ms), not recomputed
    assert level["ttft_p50_ms"] == pytest.approx(75.8063825)
    assert level["ttft_p99_ms"] >= level["ttft_p50_ms"]
    assert 9 < level["itl_p50_ms"] <= level["itl_p99_ms"] < 20  # the simulators ran at 10 ms per token
    assert level["latency_p50_ms"] <= level["latency_p99_ms"]
    assert level["aiperf_version"] == "0.13.0"
    assert level["error_examples"] == []


def test_failed_requests_are_counted_with_what_the_server_said():
    level = parse_export(SAMPLES / "errors", 2)
    assert level["requests"] == 5 and level["errors"] == 3
    assert level["error_examples"] == ["3x 400 Simulated engine failure (dcu-vllm-sim fault 'fail_first')."]


def test_when_every_request_failed_the_records_tell_it(tmp_path):
    # aiperf writes no summary then; the per-request records are what is left
    shutil.copy(SAMPLES / "all-failed" / "profile_export.jsonl", tmp_path)
    level = parse_export(tmp_path, 2)
    assert level["requests"] == 0 and level["errors"] == 4
    assert level["request_throughput_rps"] is None
    [example] = level["error_examples"]
    assert example.startswith("4x 404 The model `NoSuch` does not exist.")


def test_an_empty_directory_is_a_level_with_nothing(tmp_path):
    level = parse_export(tmp_path, 4)
    assert level["requests"] == 0 and level["errors"] == 0 and level["error_examples"] == []
