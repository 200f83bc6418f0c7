"""Timing the variants side by side, so that load from other processes falls on all of them.

Timed one after the other, a variant timed while another process ran looks slower than one
timed a second later on quiet cores, and the decision follows the other process. So every
point (batch size, length) is timed in rounds: each variant's untimed run, then rounds in
which each variant runs once, the order reversed every round (A B, B A, A B), until each has
:data:`~.measure.REPEATS` timed runs or its timed runs add up to :data:`~.measure.BUDGET_S`.
The median of a variant's runs counts. Around each point the CPU time the whole machine used
is read (:func:`~.measure.cpu_seconds`), less this process's own: the cores other processes
took while that point was timed.

:func:`disturbed` then says whether that disturbance could have changed the decision: at a
batch size where the winner beats the runner-up by a margin smaller than the share of the
cores other processes took, it could.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .decision import BUSY_CORES, Measurement, others_cores
from .measure import BUDGET_S, REPEATS, cpu_seconds

__all__ = ["Point", "Timings", "disturbed", "margins", "time_interleaved"]

#: (batch size, tokens per item)
Point = tuple[int, int]


@dataclass(slots=True)
class Timings:
    """What :func:`time_interleaved` measured."""

    #: variant -> point -> items per second (the median run).
    rates: dict[str, dict[Point, float]] = field(default_factory=dict)
    #: point -> cores other processes used while it was timed.
    others: dict[Point, float] = field(default_factory=dict)
    #: point -> wall seconds its timing took (its untimed runs included).
    spans: dict[Point, float] = field(default_factory=dict)

    def others_at(self, size: int) -> float:
        """Cores other processes used while batches of ``size`` were timed (the mean over its
        points, weighed by how long each took)."""
        points = [point for point in self.spans if point[0] == size]
        wall = sum(self.spans[point] for point in points)
        if wall <= 0:
            return 0.0
        return sum(self.others[point] * self.spans[point] for point in points) / wall

    def others_overall(self) -> float:
        wall = sum(self.spans.values())
        if wall <= 0:
            return 0.0
        return sum(self.others[p] * self.spans[p] for p in self.spans) / wall


def time_interleaved(
    runners: Mapping[str, Callable[[Any], object]],
    batches: Mapping[Point, Any],
    repeats: int = REPEATS,
    budget_s: float = BUDGET_S,
    clock: Callable[[], float] = time.perf_counter,
    load: Callable[[], tuple[float, float]] = cpu_seconds,
) -> Timings:
    """Time every runner on every batch (``batches``: point -> encoded batch), interleaved.

    :param clock: seconds (``time.perf_counter`` unless a test injects one).
    :param load: the machine's and this process's CPU seconds so far.
    """
    timings = Timings(rates={name: {} for name in runners})
    names = list(runners)
    for point, batch in batches.items():
        started, (machine, own) = clock(), load()
        for name in names:  # untimed: lazy set-up and first-shape compilation land here
            runners[name](batch)
        times: dict[str, list[float]] = {name: [] for name in names}
        round_ = 0
        while True:
            due = [name for name in names if _wants_more(times[name], repeats, budget_s)]
            if not due:
                break
            for name in due if round_ % 2 == 0 else due[::-1]:
                begun = clock()
                runners[name](batch)
                times[name].append(clock() - begun)
            round_ += 1
        wall = clock() - started
        machine_after, own_after = load()
        timings.spans[point] = wall
        timings.others[point] = others_cores(machine_after - machine, own_after - own, wall)
        for name in names:
            timings.rates[name][point] = point[0] / max(statistics.median(times[name]), 1e-9)
    return timings


def _wants_more(times: Sequence[float], repeats: int, budget_s: float) -> bool:
    return len(times) < repeats and (not times or sum(times) < budget_s)


def margins(measurements: Sequence[Measurement]) -> dict[int, float]:
    """Per batch size, how much faster the fastest usable variant was than the runner-up
    (0.1: 10 %); a size with one usable variant has an infinite margin."""
    usable = [m for m in measurements if m.usable]
    sizes = sorted({size for m in usable for size in m.items_per_s})
    found: dict[int, float] = {}
    for size in sizes:
        rates = sorted((m.items_per_s[size] for m in usable if size in m.items_per_s), reverse=True)
        found[size] = float("inf") if len(rates) < 2 else rates[0] / max(rates[1], 1e-9) - 1
    return found


def disturbed(
    measurements: Sequence[Measurement], others_by_size: Mapping[int, float], cores: int
) -> bool:
    """Whether other processes took enough of the cores, while some batch size was timed, to
    have changed its winner: at least :data:`~.decision.BUSY_CORES` cores, and a larger share
    of the ``cores`` than the winner's margin over the runner-up there."""
    by_size = margins(measurements)
    for size, others in others_by_size.items():
        if others >= BUSY_CORES and by_size.get(size, float("inf")) <= others / max(cores, 1):
            return True
    return False
