"""``load_test.stats``: percentiles, summaries, the timeline and the tool's self-checks."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

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
    # Windows of 0.5 s up to the last answer at 1.5 s; it falls in the last one.
    assert [r["failed"] for r in rows] == [0, 0, 1]
    assert rows[0]["items_per_s"] == 6.0
    assert sum(r["offered_per_s"] * r["length_s"] for r in rows) == pytest.approx(4)


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


def test_a_lag_small_beside_the_latency_is_a_note_not_a_warning() -> None:
    late: dict[str, Any] = {
        "mode": "open",
        "cpu_fraction": 0.05,
        "send_lag_p99_s": 0.005,
        "mean_gap_s": 0.02,
    }
    material = self_check(**late, latency_p99_s=0.030)
    assert len(material.warnings) == 1 and not material.notes
    immaterial = self_check(**late, latency_p99_s=0.500)
    assert not immaterial.warnings
    assert len(immaterial.notes) == 1 and "1.0% of the p99" in immaterial.notes[0]
