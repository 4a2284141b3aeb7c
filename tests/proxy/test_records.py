"""The cheap paths behind every request's record: timestamps, results lines, histograms, request ids.

What the record takes from the answers: test_answers.py."""

from __future__ import annotations

import asyncio
import json
import random
from datetime import UTC, datetime

import pytest

from dcu_serving.proxy import fastjson
from dcu_serving.proxy.metrics import Histogram
from dcu_serving.proxy.responses import new_request_id
from dcu_serving.proxy.results import ResultsLog, _line, _timestamp


@pytest.mark.parametrize("t", [0.0, 1.9995, 1.9999996, 232974087.0129997, 1795964965.9999999])
def test_timestamps_are_what_datetime_writes(t):
    assert _timestamp(t) == datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def test_timestamps_agree_with_datetime_across_many_seconds():
    rng = random.Random(4711)
    for _ in range(20000):
        t = rng.uniform(0, 4e9)
        assert _timestamp(t) == datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def test_a_line_is_one_json_object_with_an_iso_time():
    line = _line({"time": 0.25, "orid": 'quote " and \u00e9', "error": None})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"time": "1970-01-01T00:00:00.250+00:00", "orid": 'quote " and \u00e9', "error": None}


def test_a_lone_surrogate_from_the_caller_costs_no_line(tmp_path):  # orjson cannot write one
    path = tmp_path / "results.jsonl"

    async def log_three():
        log = ResultsLog(str(path))
        for orid in ("before", "\ud800 from JSON", "after"):
            log.write({"time": 0.0, "orid": orid})
        log.close()

    asyncio.run(log_three())
    assert [json.loads(line)["orid"] for line in path.read_text().splitlines()] == ["before", "\ud800 from JSON",
                                                                                   "after"]


def test_histogram_buckets_are_inclusive_upper_bounds():
    h = Histogram("h", "test", (0.1, 1))
    for value in (0.05, 0.1, 0.5, 1, 7):
        h.observe(value)
    buckets = {b.labels["le"]: b.value for b in h.family().samples if b.name == "h_bucket"}
    assert buckets == {"0.1": 2, "1.0": 4, "+Inf": 5}
    assert h.sum == pytest.approx(8.65)


def test_request_ids_are_unique_hex_of_uuid_length():
    ids = {new_request_id() for _ in range(10000)}
    assert len(ids) == 10000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


@pytest.mark.parametrize("text", [b'{"error": "\\ud800"}', b'{"usage": {"prompt_tokens": NaN}}'])
def test_json_orjson_refuses_is_still_read_as_the_standard_library_reads_it(text):
    assert repr(fastjson.loads(text)) == repr(json.loads(text))
    with pytest.raises(ValueError, match="Expecting property name"):
        fastjson.loads(b"{broken")


def test_json_orjson_cannot_write_is_written_escaped():
    data = {"orid": "\ud800 lone", "big": 2**70, "name": "\u00e9"}
    for written in (fastjson.dumps(data), fastjson.line(data).rstrip(b"\n")):
        assert json.loads(written) == data
