"""The meter of other work: busy CPU time less the batches' own threads, per wall second."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest

from batching.models.engines.contention import MIN_WINDOW, Contention, busy_seconds


class Counters:
    def __init__(self) -> None:
        self.busy = 100.0
        self.now = 0.0
        self.reads = 0

    def read(self, cpus: Sequence[int]) -> float:
        self.reads += 1
        return self.busy

    def clock(self) -> float:
        return self.now


def test_other_work_is_busy_time_less_the_batches_threads_per_second() -> None:
    counters = Counters()
    meter = Contention((0, 1), counters.read, counters.clock)
    # One second: a batch kept one thread busy 0.5 s; the CPUs were busy 1.5 s in all.
    meter.ran(1, 0.5)
    counters.now, counters.busy = 1.0, 101.5
    assert meter.others() == pytest.approx(1.0)
    # The next second: only the batches' own threads ran.
    meter.ran(2, 0.25)
    counters.now, counters.busy = 2.0, 102.0
    assert meter.others() == pytest.approx(0.0)


def test_a_reading_covers_at_least_the_minimum_window() -> None:
    counters = Counters()
    meter = Contention((0, 1), counters.read, counters.clock)
    counters.now = MIN_WINDOW / 2
    assert meter.others() is None
    counters.now, counters.busy = 1.0, 101.0
    assert meter.others() == pytest.approx(1.0)
    reads = counters.reads
    counters.now = 1.0 + MIN_WINDOW / 2
    assert meter.others() == pytest.approx(1.0)
    assert counters.reads == reads


def test_no_meter_under_a_quota_or_on_one_cpu() -> None:
    cpus = len(os.sched_getaffinity(0))
    assert Contention.for_budget(1) is None
    assert Contention.for_budget(cpus + 1) is None
    meter = Contention.for_budget(cpus)
    assert (meter is not None) == (cpus >= 2)


def test_the_kernel_counters_grow() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    first = busy_seconds(cpus)
    total = 0
    for index in range(2_000_000):
        total += index
    assert busy_seconds(cpus) > first
