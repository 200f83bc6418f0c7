"""Tests of the load-testing tool itself (``load_test``), against a fast fake server.

Pure parts (statistics, the open-loop schedule, the Prometheus parser, payloads, the
self-checks) are tested on their own; the commands end to end against
:mod:`tests.fake_server`, in-process for ``run`` and as a subprocess for the experiments that
start their own server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import statistics
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from load_test.__main__ import main
from load_test.client import LoadSpec, Target, count_outputs
from load_test.experiments import finalists, recommend
from load_test.http1 import _parse_chunked
from load_test.measure import measure
from load_test.metrics_scrape import batch_report, parse_histograms, parse_samples
from load_test.payloads import build_payloads, load_texts, make_sentence, parse_range
from load_test.procstat import machine_ticks, tree_cpu_seconds
from load_test.schedule import Segment, arrivals, expected_count, ramp, steps
from load_test.stats import (
    CONNECTION_ERROR,
    INVALID,
    TIMEOUT,
    Columns,
    lag_limit,
    latency_summary,
    outcome_counts,
    percentile,
    self_check,
    summarize,
    timeline,
)
from tests.fake_server import FakeSettings, serve

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_MAGIC, path
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    # A blank canvas is one colour; a plot's lines, bars and text spread the values.
    assert float(pixels[..., :3].std()) > 0.05


# --- statistics -----------------------------------------------------------------------------


@given(
    st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=300),
    st.sampled_from([0, 1, 10, 25, 50, 75, 90, 95, 99, 99.9, 100]),
)
def test_percentile_is_nearest_rank_like_numpy_inverted_cdf(values: list[float], q: float) -> None:
    ordered = sorted(values)
    expected = float(np.percentile(np.array(values), q, method="inverted_cdf"))
    assert percentile(ordered, q) == expected
    # Nearest rank: always a value some request actually had.
    assert percentile(ordered, q) in values


def test_percentile_of_nothing_is_nan_and_q_is_checked() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_percentile_of_a_thousand_values_at_exact_ranks() -> None:
    values = [float(v) for v in range(1, 1001)]
    assert percentile(values, 50) == 500
    assert percentile(values, 99) == 990
    assert percentile(values, 99.9) == 999
    assert percentile(values, 100) == 1000


def test_latency_summary_in_milliseconds() -> None:
    summary = latency_summary([0.001 * v for v in range(1, 101)])
    assert summary["count"] == 100
    assert summary["p50_ms"] == 50
    assert summary["p90_ms"] == 90
    assert summary["p99_ms"] == 99
    assert summary["max_ms"] == 100
    assert summary["min_ms"] == 1
    assert summary["mean_ms"] == pytest.approx(50.5)
    assert latency_summary([])["p99_ms"] is None


def test_outcomes_keep_503_504_other_codes_and_failures_apart() -> None:
    statuses = [200, 200, 200, 503, 503, 504, 404, 500, 500, CONNECTION_ERROR, TIMEOUT, INVALID]
    counts = outcome_counts(statuses, {"ConnectionRefusedError": 1, "timeout": 1})
    assert counts.ok == 3
    assert counts.overloaded_503 == 2
    assert counts.deadline_504 == 1
    assert counts.other_http == {"404": 1, "500": 2}
    assert (counts.connection_errors, counts.timeouts, counts.invalid) == (1, 1, 1)
    assert counts.total == len(statuses)
    assert counts.as_dict()["error_kinds"] == {"ConnectionRefusedError": 1, "timeout": 1}


def _columns(rows: list[tuple[float, float, int, int]]) -> Columns:
    """Columns from (intended, done, status, items), sent on time."""
    intended = [r[0] for r in rows]
    return Columns(
        intended=intended,
        dispatched=intended,
        sent=intended,
        done=[r[1] for r in rows],
        status=[r[2] for r in rows],
        items=[r[3] for r in rows],
        phase=[0] * len(rows),
    )


def test_summary_throughput_counts_200_answers_and_their_items_only() -> None:
    # Four requests over 2 s from start 10.0; one 503 that answers fast.
    cols = _columns(
        [(10.0, 10.5, 200, 3), (10.5, 11.0, 200, 1), (11.0, 11.1, 503, 4), (11.5, 12.0, 200, 2)]
    )
    summary = summarize(cols, start=10.0)
    assert summary["duration_s"] == 2.0
    assert summary["throughput"]["requests_per_s"] == 1.5
    assert summary["throughput"]["items_per_s"] == 3.0
    assert summary["throughput"]["attempted_requests_per_s"] == 2.0
    assert summary["latency"]["count"] == 3  # the 503 is counted, not timed
    assert summary["latency"]["max_ms"] == 500
    assert summary["outcomes"]["503"] == 1
    assert summary["error_rate"] == 0.25


def test_timeline_windows_count_answers_where_they_completed() -> None:
    cols = _columns(
        [(0.0, 0.2, 200, 1), (0.1, 0.4, 200, 2), (0.6, 1.2, 503, 1), (1.1, 1.5, 200, 1)]
    )
    rows = timeline(cols, start=0.0, window=0.5)
    assert [r["ok_per_s"] for r in rows[:2]] == [4.0, 0.0]
    assert [r["failed"] for r in rows] == [0, 0, 1, 0][: len(rows)]
    assert rows[0]["items_per_s"] == 6.0
    assert sum(r["offered_per_s"] * r["length_s"] for r in rows) == pytest.approx(4)


# --- the tool's self-checks -----------------------------------------------------------------


def test_lag_limit_is_a_tenth_of_the_gap_clamped_to_2_and_5_ms() -> None:
    assert lag_limit(1.0) == 0.005
    assert lag_limit(0.03) == pytest.approx(0.003)
    assert lag_limit(0.001) == 0.002


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"mode": "closed", "cpu_fraction": 0.5}, []),
        ({"mode": "closed", "cpu_fraction": 0.95}, ["CPU core"]),
        ({"mode": "open", "cpu_fraction": 0.1, "send_lag_p99_s": 0.001, "mean_gap_s": 0.01}, []),
        (
            {"mode": "open", "cpu_fraction": 0.1, "send_lag_p99_s": 0.004, "mean_gap_s": 0.01},
            ["send lag"],
        ),
        (
            {
                "mode": "open",
                "cpu_fraction": 0.1,
                "send_lag_p99_s": 0.004,
                "mean_gap_s": 0.01,
                "machine_busy": 0.97,
            },
            ["the machine's 97%"],
        ),
        (
            {
                "mode": "open",
                "cpu_fraction": 0.1,
                "connections_full": True,
                "connection_wait_p99_s": 0.2,
            },
            ["--max-connections"],
        ),
        ({"mode": "closed", "cpu_fraction": 0.1, "loop_lag_p99_s": 0.05}, ["event loop"]),
        ({"mode": "closed", "cpu_fraction": 0.1, "other_cores": 0.8}, ["other processes"]),
        ({"mode": "closed", "cpu_fraction": 0.1, "other_cores": 0.1}, []),
        (
            {"mode": "open", "cpu_fraction": 0.1, "offered_per_s": 100, "achieved_per_s": 60},
            ["saturated"],
        ),
    ],
)
def test_self_check_warnings(kwargs: dict[str, Any], expected: list[str]) -> None:
    warnings = self_check(**kwargs).warnings
    assert len(warnings) == len(expected)
    for warning, needle in zip(warnings, expected, strict=True):
        assert needle in warning


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc")
def test_procstat_sees_this_process_burn_cpu() -> None:
    import os
    import time

    busy_before = machine_ticks()
    before = tree_cpu_seconds(os.getpid())
    spent = time.process_time()
    while time.process_time() - spent < 0.2:
        pass
    after = tree_cpu_seconds(os.getpid())
    busy_after = machine_ticks()
    assert before is not None and after is not None
    assert after - before >= 0.15  # clock ticks are 10 ms
    assert busy_before is not None and busy_after is not None
    assert busy_after[0] - busy_before[0] > 0


def test_a_lag_small_beside_the_latency_is_a_note_not_a_warning() -> None:
    late = {"mode": "open", "cpu_fraction": 0.05, "send_lag_p99_s": 0.005, "mean_gap_s": 0.02}
    material = self_check(**late, latency_p99_s=0.030)
    assert len(material.warnings) == 1 and not material.notes
    immaterial = self_check(**late, latency_p99_s=0.500)
    assert not immaterial.warnings
    assert len(immaterial.notes) == 1 and "1.0% of the p99" in immaterial.notes[0]


# --- the open-loop schedule -----------------------------------------------------------------


def test_fixed_rate_is_evenly_spaced_from_zero() -> None:
    times = [t for t, _ in itertools.islice(arrivals([Segment(250, 250, math.inf)]), 1000)]
    assert times[0] == 0
    gaps = np.diff(times)
    assert np.allclose(gaps, 1 / 250, rtol=0, atol=1e-12)


def test_fixed_rate_over_a_duration_gives_rate_times_duration_arrivals() -> None:
    assert len(list(arrivals([Segment(40, 40, 2.5)]))) == 100


def test_poisson_has_the_mean_rate_and_exponential_gaps() -> None:
    times = [t for t, _ in arrivals([Segment(200, 200, 50.0)], "poisson", seed=7)]
    # 10,000 expected, standard deviation 100: 4% is four standard deviations.
    assert len(times) == pytest.approx(10_000, rel=0.04)
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / 200, rel=0.04)
    # Exponential gaps have a coefficient of variation of 1; fixed spacing has 0.
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)
    assert times == sorted(times) and times[-1] < 50.0


def test_poisson_is_repeatable_by_seed() -> None:
    def first(seed: int) -> list[float]:
        segment = [Segment(100, 100, math.inf)]
        return [t for t, _ in itertools.islice(arrivals(segment, "poisson", seed), 50)]

    assert first(3) == first(3)
    assert first(3) != first(4)


def test_steps_hold_each_rate_for_its_duration() -> None:
    schedule = list(arrivals(steps([10, 40, 20], 2.0)))
    per_phase = [sum(1 for _, p in schedule if p == k) for k in range(3)]
    assert per_phase == [20, 80, 40]
    for t, phase in schedule:
        assert 2.0 * phase <= t < 2.0 * (phase + 1)
    second = [t for t, p in schedule if p == 1]
    assert np.allclose(np.diff(second), 1 / 40, atol=1e-9)


def test_ramp_arrivals_follow_the_rising_rate() -> None:
    segments = ramp(0, 100, 10.0)  # expected arrivals: area of the triangle, 500
    assert expected_count(segments) == 500
    times = [t for t, _ in arrivals(segments)]
    assert len(times) == 500
    # Cumulative intensity at t is 5 t^2: 125 arrivals before 5 s, 375 after.
    assert sum(1 for t in times if t < 5.0) == 125
    gaps = np.diff(times)
    assert gaps[-1] < gaps[len(gaps) // 2] < gaps[10]  # closer together as the rate rises
    assert 0.0099 < gaps[-1] < 0.0101  # near 1/100 s at the top of the ramp


def test_poisson_ramp_count_is_near_expected() -> None:
    counts = [len(list(arrivals(ramp(50, 150, 20.0), "poisson", seed))) for seed in range(5)]
    assert statistics.mean(counts) == pytest.approx(2000, rel=0.03)


def test_segments_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        Segment(0, 0, 1)
    with pytest.raises(ValueError):
        Segment(10, 20, math.inf)
    with pytest.raises(ValueError):
        list(arrivals([Segment(1, 1, 1)], "bursty"))


# --- Prometheus metrics ---------------------------------------------------------------------

METRICS_BEFORE = """\
# HELP batching_batch_size_items Items per batch run.
# TYPE batching_batch_size_items histogram
batching_batch_size_items_bucket{le="1.0",model="minilm"} 2.0
batching_batch_size_items_bucket{le="2.0",model="minilm"} 2.0
batching_batch_size_items_bucket{le="4.0",model="minilm"} 3.0
batching_batch_size_items_bucket{le="8.0",model="minilm"} 3.0
batching_batch_size_items_bucket{le="+Inf",model="minilm"} 3.0
batching_batch_size_items_sum{model="minilm"} 5.0
batching_batch_size_items_count{model="minilm"} 3.0
batching_requests_total{code="200",model="minilm"} 3.0
"""

METRICS_AFTER = """\
# HELP batching_batch_size_items Items per batch run.
# TYPE batching_batch_size_items histogram
batching_batch_size_items_bucket{le="1.0",model="minilm"} 4.0
batching_batch_size_items_bucket{le="2.0",model="minilm"} 5.0
batching_batch_size_items_bucket{le="4.0",model="minilm"} 7.0
batching_batch_size_items_bucket{le="8.0",model="minilm"} 13.0
batching_batch_size_items_bucket{le="+Inf",model="minilm"} 13.0
batching_batch_size_items_sum{model="minilm"} 70.0
batching_batch_size_items_count{model="minilm"} 13.0
batching_batch_size_items_bucket{model="other \\"quoted\\"",le="1.0"} 1.0 1700000000000
batching_batch_size_items_bucket{model="other \\"quoted\\"",le="+Inf"} 1.0 1700000000000
batching_batch_size_items_sum{model="other \\"quoted\\""} 1.0
batching_batch_size_items_count{model="other \\"quoted\\""} 1.0
"""


def test_parse_samples_reads_labels_escapes_and_skips_comments() -> None:
    samples = list(parse_samples(METRICS_AFTER))
    assert len(samples) == 11
    name, labels, value = samples[-1]
    assert name == "batching_batch_size_items_count"
    assert labels == {"model": 'other "quoted"'}
    assert value == 1.0
    assert list(parse_samples('up 1\n# comment\n\nx{a="b\\\\c"} +Inf\n')) == [
        ("up", {}, 1.0),
        ("x", {"a": "b\\c"}, math.inf),
    ]


def test_parse_histograms_groups_series_without_le() -> None:
    hists = parse_histograms(METRICS_AFTER)
    assert set(hists) == {'model="minilm"', 'model="other \\"quoted\\""'}
    minilm = hists['model="minilm"']
    assert minilm.buckets[0] == (1.0, 4.0)
    assert minilm.buckets[-1] == (math.inf, 13.0)
    assert (minilm.sum, minilm.count) == (70.0, 13.0)


def test_batch_report_is_the_difference_between_scrapes() -> None:
    report = batch_report(METRICS_BEFORE, METRICS_AFTER)
    assert report is not None
    minilm = report['model="minilm"']
    assert minilm["batches"] == 10
    assert minilm["items"] == 65
    assert minilm["mean_size"] == 6.5
    assert minilm["sizes"] == {"1": 2, "2": 1, "3-4": 1, "5-8": 6}
    assert minilm["p50_bucket"] == "5-8"
    # A series that appeared between the scrapes counts from zero.
    assert report['model="other \\"quoted\\""']["batches"] == 1


def test_batch_report_without_the_histogram_is_none() -> None:
    assert batch_report(None, None) is None
    assert batch_report("", "up 1\n") is None


# --- payloads -------------------------------------------------------------------------------


def test_parse_range() -> None:
    assert parse_range("4") == (4, 4)
    assert parse_range("1-6") == (1, 6)
    for bad in ("0", "6-1", "a", "1-"):
        with pytest.raises(ValueError):
            parse_range(bad)


def test_sentences_have_the_requested_number_of_words() -> None:
    import random

    rng = random.Random(1)
    for words in (1, 5, 40):
        sentence = make_sentence(rng, words)
        assert len(sentence.split()) == words
        assert sentence[0].isupper() and sentence.endswith(".")


@pytest.mark.parametrize("api", ["plain", "json", "v2"])
def test_payload_bodies_decode_to_their_inputs(api: str) -> None:
    items = (1, 1) if api == "plain" else (1, 6)
    payloads = build_payloads(api=api, items=items, words=(3, 8), count=200, seed=5)
    assert len(payloads) == 200
    counts = [p.items for p in payloads.payloads]
    assert min(counts) == items[0] and max(counts) == items[1]
    for payload in payloads.payloads:
        if api == "plain":
            texts = [payload.body.decode()]
        elif api == "json":
            texts = orjson.loads(payload.body)["inputs"]
        else:
            (tensor,) = orjson.loads(payload.body)["inputs"]
            assert tensor["datatype"] == "BYTES"
            assert tensor["shape"] == [payload.items, 1]
            texts = tensor["data"]
        assert len(texts) == payload.items
        assert all(3 <= len(t.split()) <= 8 for t in texts)
    expected_path = "/v2/models/all-MiniLM-L6-v2/infer" if api == "v2" else "/"
    assert payloads.path == expected_path
    again = build_payloads(api=api, items=items, words=(3, 8), count=200, seed=5)
    assert again == payloads


def test_plain_bodies_carry_one_input_only() -> None:
    with pytest.raises(ValueError, match="one input"):
        build_payloads(api="plain", items=(1, 2))


def test_payloads_from_a_file(tmp_path: Path) -> None:
    lines = tmp_path / "inputs.txt"
    lines.write_text("first line\n\nsecond line\nthird\n")
    texts = load_texts(lines)
    assert texts == ["first line", "second line", "third"]
    as_json = tmp_path / "inputs.json"
    as_json.write_bytes(orjson.dumps(["a", "b"]))
    assert load_texts(as_json) == ["a", "b"]
    payloads = build_payloads(api="json", items=(2, 2), texts=texts, count=20)
    for payload in payloads.payloads:
        assert set(orjson.loads(payload.body)["inputs"]) <= set(texts)


def test_count_outputs_reads_both_answer_shapes() -> None:
    assert count_outputs("json", b'{"model": "m", "outputs": [1, 2, 3]}') == 3
    assert count_outputs("v2", b'{"outputs": [{"name": "e", "shape": [4, 384], "data": []}]}') == 4
    assert count_outputs("json", b"not json") is None
    assert count_outputs("json", b'{"error": "x"}') is None


def test_chunked_bodies_are_reassembled() -> None:
    raw = bytearray(b"HEAD\r\n\r\n4\r\nWiki\r\n6;ext=1\r\npedia \r\n0\r\n\r\nNEXT")
    body, consumed = _parse_chunked(raw, 8) or (b"", 0)
    assert body == b"Wikipedia "
    assert raw[consumed:] == b"NEXT"
    assert _parse_chunked(bytearray(b"4\r\nWi"), 0) is None


# --- end to end against the fake server -----------------------------------------------------


def _run(args: list[str]) -> int:
    return main(["run", "--no-progress", *args])


def test_run_closed_loop_reports_outcomes_items_and_batches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = FakeSettings(failures={3: 503, 7: 504})
    with serve(settings) as (url, fake):
        code = _run(
            ["--url", url, "-c", "4", "-n", "100", "--items", "1-6", "--out-dir", str(tmp_path)]
        )
        ok_batches = list(fake.batches)
    assert code == 0
    doc = orjson.loads((tmp_path / "result.json").read_bytes())
    summary = doc["summary"]
    assert summary["requests"] == 100
    outcomes = summary["outcomes"]
    assert (outcomes["200"], outcomes["503"], outcomes["504"]) == (80, 10, 10)
    assert outcomes["connection_errors"] == outcomes["timeouts"] == 0
    assert outcomes["other_http"] == {}
    # The tool's count of items answered agrees with what the server computed...
    assert summary["ok_items"] == sum(ok_batches)
    # ...and with the batch histogram it scraped from /metrics.
    batches = doc["server_batches"]['model="fake"']
    assert batches["batches"] == 80
    assert batches["items"] == summary["ok_items"]
    assert summary["latency"]["count"] == 80
    assert summary["throughput"]["requests_per_s"] > 0
    assert doc["load"]["concurrency"] == 4
    assert doc["client"]["connections_opened"] == 4
    for name in ("latency.png", "timeline.png"):
        assert_png(tmp_path / name)
    printed = capsys.readouterr().out
    assert "503: 10" in printed and "504: 10" in printed


def test_run_open_loop_steps_over_v2_with_a_progress_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve(FakeSettings(model_name="all-MiniLM-L6-v2")) as (url, _):
        code = main(
            [
                "run",
                "--url",
                url,
                "--api",
                "v2",
                "--steps",
                "100,200",
                "--step-duration",
                "0.3",
                "--arrival",
                "fixed",
                "--items",
                "2",
                "--progress",
                "--out-dir",
                str(tmp_path),
            ]
        )
    assert code == 0
    doc = orjson.loads((tmp_path / "result.json").read_bytes())
    assert doc["summary"]["requests"] == 90
    assert doc["summary"]["outcomes"]["200"] == 90
    assert doc["summary"]["ok_items"] == 180
    assert [p["requests"] for p in doc["phases"]] == [30, 60]
    assert [p["offered_rate"] for p in doc["phases"]] == [100, 200]
    assert doc["client"]["send_lag"]["count"] == 90
    assert doc["client"]["offered_requests_per_s"] == pytest.approx(150, rel=0.2)
    for name in ("latency.png", "timeline.png", "rates.png"):
        assert_png(tmp_path / name)
    assert "req" in capsys.readouterr().err  # the bar drew on stderr


def test_run_open_loop_ramp_sends_the_ramps_arrivals(tmp_path: Path) -> None:
    with serve(FakeSettings()) as (url, fake):
        args = ["--url", url, "--ramp", "50:150", "-d", "0.5", "--arrival", "fixed"]
        assert _run([*args, "--no-plots", "--out-dir", str(tmp_path)]) == 0
        served = fake.arrivals
    doc = orjson.loads((tmp_path / "result.json").read_bytes())
    # Expected arrivals: the area under the ramp, (50 + 150) / 2 * 0.5 s.
    assert doc["summary"]["requests"] == served == 50
    assert doc["load"]["segments"] == [{"start_rate": 50, "end_rate": 150, "duration_s": 0.5}]


def test_concurrency_sweep_writes_a_point_per_level(tmp_path: Path) -> None:
    with serve(FakeSettings()) as (url, _):
        code = main(
            [
                "concurrency-sweep",
                "--url",
                url,
                "--levels",
                "1,4",
                "-n",
                "40",
                "--items",
                "1-3",
                "--warmup",
                "4",
                "--no-progress",
                "--out-dir",
                str(tmp_path),
            ]
        )
    assert code == 0
    doc = orjson.loads((tmp_path / "sweep.json").read_bytes())
    assert [p["x"] for p in doc["points"]] == [1, 4]
    assert [r["summary"]["requests"] for r in doc["runs"]] == [40, 40]
    assert all(p["mean_batch"] is not None for p in doc["points"])
    assert "| clients |" in doc["table_markdown"]
    assert_png(tmp_path / "sweep.png")


def test_httpx_client_counts_alike(tmp_path: Path) -> None:
    with serve(FakeSettings(failures={1: 503})) as (url, _):
        args = ["--url", url, "-c", "3", "-n", "30", "--http-client", "httpx", "--no-plots"]
        assert _run([*args, "--out-dir", str(tmp_path)]) == 0
    outcomes = orjson.loads((tmp_path / "result.json").read_bytes())["summary"]["outcomes"]
    assert (outcomes["200"], outcomes["503"]) == (27, 3)


def test_v2_run_naming_an_unknown_model_stops_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve(FakeSettings(model_name="served")) as (url, fake):
        with pytest.raises(SystemExit) as exit_info:
            _run(["--url", url, "--api", "v2", "-n", "5", "--out-dir", str(tmp_path)])
        assert fake.arrivals == 0
    assert exit_info.value.code == 2
    assert "--model-name" in capsys.readouterr().err


@contextlib.contextmanager
def raw_http_server() -> Iterator[str]:
    """A hand-written HTTP/1.1 server whose answers vary in framing and connection handling:
    chunked; ``Connection: close``; and keep-alive that it then closes anyway (the race a
    client must retry through)."""
    loop = asyncio.new_event_loop()
    answered = itertools.count()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                kind = next(answered) % 3
                if kind == 0:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b'5\r\n{"out\r\n9\r\nputs": [1\r\n2\r\n]}\r\n0\r\n\r\n'
                    )
                    await writer.drain()
                    continue
                body = b'{"outputs": [1]}'
                close = b"Connection: close\r\n" if kind == 1 else b""
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), close, body)
                )
                await writer.drain()
                break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()


def test_client_handles_chunked_close_and_closed_keep_alive_connections() -> None:
    with raw_http_server() as url:
        payloads = build_payloads(api="json", items=(1, 1), count=4)
        spec = LoadSpec(payloads=payloads, concurrency=1, requests=30)
        measured = measure(Target.parse(url), spec, scrape=False)
    summary = measured.doc["summary"]
    assert summary["outcomes"]["200"] == 30, summary["outcomes"]
    assert measured.doc["client"]["connections_opened"] >= 20


def test_run_counts_connection_errors_when_nothing_listens(tmp_path: Path) -> None:
    from load_test.serverproc import free_port

    url = f"http://127.0.0.1:{free_port()}"
    code = _run(["--url", url, "-c", "2", "-n", "10", "--out-dir", str(tmp_path), "--no-plots"])
    assert code == 1
    doc = orjson.loads((tmp_path / "result.json").read_bytes())
    assert doc["summary"]["outcomes"]["connection_errors"] == 10
    assert doc["summary"]["outcomes"]["error_kinds"] == {"ConnectionRefusedError": 10}
    assert doc["server_batches"] is None


def test_open_loop_latency_includes_a_stall_that_held_back_sends() -> None:
    """No coordinated omission: requests the tool could not send while the server stalled
    (its only connection was stuck) are timed from when they were due, not from when they
    finally went out."""
    stall = 0.3
    with serve(FakeSettings(stall_at=5, stall_s=stall)) as (url, _):
        payloads = build_payloads(api="json", items=(1, 1), count=8)
        spec = LoadSpec(
            payloads=payloads,
            segments=(Segment(100, 100, math.inf),),
            process="fixed",
            requests=40,
            max_connections=1,
        )
        measured = measure(Target.parse(url), spec, scrape=False)
    rec = measured.result.records
    assert rec.status == [200] * 40
    order = sorted(range(40), key=lambda i: rec.intended[i])
    latency = [rec.done[i] - rec.intended[i] for i in order]
    service = [rec.done[i] - rec.sent[i] for i in order]
    stalled = order[5]
    stall_end = rec.done[stalled]
    assert stall_end - rec.sent[stalled] >= stall * 0.9
    # Every request due during the stall finished after it, and its latency says so.
    during = [k for k in range(6, 40) if rec.intended[order[k]] < stall_end]
    assert len(during) >= 20
    for k in during:
        assert latency[k] >= stall_end - rec.intended[order[k]]
        assert latency[k] > service[k]
    # Timed from the actual send, the stall would have shown in one request only.
    slow_by_send = sum(1 for s in service if s > 0.1)
    slow_by_schedule = sum(1 for v in latency if v > 0.1)
    assert slow_by_send == 1
    assert slow_by_schedule >= 15
    doc = measured.doc
    assert doc["summary"]["latency"]["p90_ms"] > 100
    assert doc["summary"]["service_time"]["p90_ms"] < 100
    assert any("--max-connections" in w for w in doc["client"]["warnings"])


def test_open_loop_sends_on_schedule_while_the_server_is_slow() -> None:
    # With connections to spare, requests go out on time even while earlier ones hang.
    with serve(FakeSettings(stall_at=0, stall_s=0.2)) as (url, _):
        payloads = build_payloads(api="json", items=(1, 1), count=4)
        spec = LoadSpec(
            payloads=payloads,
            segments=(Segment(100, 100, math.inf),),
            process="fixed",
            requests=15,
            max_connections=64,
        )
        measured = measure(Target.parse(url), spec, scrape=False)
    rec = measured.result.records
    lags = [rec.sent[i] - rec.intended[i] for i in range(len(rec))]
    assert max(lags) < 0.1  # none waited for the stall to end before being sent
    assert measured.doc["client"]["max_in_flight"] > 5


def _config(batch: int, points: list[tuple[int, float, float]], **extra: Any) -> dict[str, Any]:
    """A tune result with (clients, items/s, p99 ms) points and no failures."""
    made = [
        {"concurrency": c, "items_per_s": rate, "p99_ms": p99, "error_rate": 0.0}
        for c, rate, p99 in points
    ]
    meeting = [p for p in made if p["p99_ms"] <= 100]
    return {
        "name": f"b{batch}",
        "setting": {"max_batch_size": batch, "max_queue_delay_ms": 2.0, "instances": 1},
        "points": made,
        "best_point": max(meeting, key=lambda p: p["items_per_s"], default=None),
        **extra,
    }


def test_recommend_takes_the_most_throughput_within_the_goal() -> None:
    configs = [
        _config(1, [(1, 100, 20), (2, 110, 90)]),
        _config(8, [(1, 150, 15), (4, 400, 80), (8, 480, 140)]),  # 480 misses the goal
        _config(32, [(1, 140, 18), (4, 390, 60)]),
    ]
    config, point = recommend(configs, 100, 0.01) or ({}, {})
    assert config["name"] == "b8" and point["items_per_s"] == 400
    assert recommend(configs, 10, 0.01) is None
    failing = [_config(8, [(4, 400, 80)])]
    failing[0]["points"][0]["error_rate"] = 0.05
    assert recommend(failing, 100, 0.01) is None


def test_recommend_breaks_near_ties_toward_lower_p99_and_trusts_confirmed_runs() -> None:
    tie = [_config(8, [(4, 400, 90)]), _config(32, [(4, 396, 50)])]
    assert (recommend(tie, 100, 0.01) or ({}, {}))[0]["name"] == "b32"
    lucky = _config(8, [(4, 500, 80)])
    lucky["confirmed"] = {"concurrency": 4, "items_per_s": 380, "p99_ms": 85, "error_rate": 0}
    steady = _config(32, [(4, 450, 70)])
    steady["confirmed"] = {"concurrency": 4, "items_per_s": 440, "p99_ms": 75, "error_rate": 0}
    config, point = recommend([lucky, steady], 100, 0.01) or ({}, {})
    assert config["name"] == "b32" and point["items_per_s"] == 440
    # When every confirming run missed the goal, the search points decide after all.
    steady["confirmed"]["p99_ms"] = lucky["confirmed"]["p99_ms"] = 150
    assert (recommend([lucky, steady], 100, 0.01) or ({}, {}))[0]["name"] == "b8"


def test_finalists_are_the_settings_within_ten_percent_of_the_best() -> None:
    configs = [
        _config(1, [(1, 100, 20)]),
        _config(8, [(4, 455, 80)]),
        _config(16, [(4, 500, 80)]),
        _config(32, [(4, 460, 80)]),
        _config(64, [(4, 300, 300)]),  # never met the goal
    ]
    assert [c["name"] for c in finalists(configs)] == ["b16", "b32", "b8"]
    assert [c["name"] for c in finalists(configs, limit=1)] == ["b16"]


# --- experiments that start their own server (the fake, as a subprocess) --------------------

FAKE_SERVER = ["--server-cmd", "{python} -m tests.fake_server", "--server-dir", str(ROOT)]


@pytest.mark.slow
def test_triton_batching_experiment_writes_table_and_plot(tmp_path: Path) -> None:
    code = main(
        [
            "triton-batching",
            *FAKE_SERVER,
            "--clients",
            "8",
            "--requests",
            "40",
            "--sizes",
            "1,4",
            "--warmup",
            "8",
            "--no-progress",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    doc = orjson.loads((tmp_path / "triton_batching.json").read_bytes())
    rows = {(r["batching"], r["items_per_request"]): r for r in doc["rows"]}
    assert set(rows) == {("off", 1), ("off", 4), ("on", 1), ("on", 4)}
    assert rows["off", 4]["mean_batch"] == 1.0  # max_batch_size 1 splits every request
    assert rows["on", 4]["mean_batch"] > 1.0
    assert all(r["error_rate"] == 0 for r in rows.values())
    assert "| items/req |" in doc["table_markdown"]
    if Path("/proc/stat").exists():
        # The tool knew the server's pid, so it measured the server's CPU apart.
        assert all(run["client"]["server_cpu_cores"] is not None for run in doc["runs"])
    assert_png(tmp_path / "triton_batching.png")


@pytest.mark.slow
def test_tune_recommends_the_fastest_setting_within_the_goal(tmp_path: Path) -> None:
    # The fake costs 2 ms + 0.2 ms per item per batch: without batching 8 clients need
    # ~18 ms a round, with batches of 8 one round costs ~3.6 ms; the loose goal keeps the
    # outcome the same on a slow, busy machine.
    code = main(
        [
            "tune",
            *FAKE_SERVER,
            "--p99-ms",
            "200",
            "--max-batch-sizes",
            "1,8",
            "--delays-ms",
            "1,2",
            "--instances",
            "1",
            "--levels",
            "1,8",
            "--duration",
            "0.4",
            "--refine",
            "0",
            "--confirm-s",
            "0.5",
            "--verify-s",
            "0.5",
            "--warmup",
            "8",
            "--no-progress",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    doc = orjson.loads((tmp_path / "tune.json").read_bytes())
    # Descent: both batch sizes at the middle delay, then the other delay with the best size.
    assert len(doc["configs"]) == 3
    for config in doc["configs"]:
        # Settings too close to call on short points were re-measured before choosing.
        assert ("confirmed" in config) == (config["name"] in doc["finalists"])
    recommendation = doc["recommendation"]
    assert recommendation["setting"]["max_batch_size"] == 8
    assert recommendation["p99_ms"] <= 200
    assert "--max-batch-size" in recommendation["server_flags"]
    verification = recommendation["verification"]
    assert verification["tries"]
    assert verification["poisson_rate_within_goal"] is not None
    ceiling = 0.9 * recommendation["requests_per_s"]
    assert verification["poisson_rate_within_goal"] == pytest.approx(ceiling, abs=0.01) or (
        verification["poisson_rate_within_goal"] < ceiling
    )
    by_size = {c["setting"]["max_batch_size"]: c for c in doc["configs"]}
    assert by_size[8]["best_point"]["items_per_s"] > by_size[1]["best_point"]["items_per_s"]
    assert_png(tmp_path / "tune.png")


def test_cli_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("run", "concurrency-sweep", "triton-batching", "tune"):
        assert command in out


def test_cli_rejects_contradictory_loads() -> None:
    with pytest.raises(SystemExit):
        main(["run", "--concurrency", "4", "--rate", "10"])
    with pytest.raises(SystemExit):
        main(["run", "--api", "plain", "--items", "2", "--no-progress"])


def test_package_runs_as_a_module() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "load_test", "tune", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert "--p99-ms" in done.stdout
