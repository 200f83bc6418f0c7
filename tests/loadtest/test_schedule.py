"""``load_test.schedule``: the open-loop arrival times."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest

from load_test.schedule import Segment, arrivals, expected_count, ramp, steps


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
