"""Open-loop arrival times: when each request is meant to be sent, decided before the run.

A load is a list of segments, each with a rate that is constant (a step) or changes linearly
(a ramp). Arrivals are placed on the segments' cumulative intensity: a fixed process puts one
arrival at every whole unit of it, a Poisson process at the sums of unit exponential gaps.
One mapping serves every shape, so fixed spacing, Poisson, ramps and steps agree with each
other by construction. Everything here is pure: no clock, no sleeping.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = [
    "PROCESSES",
    "Segment",
    "arrivals",
    "expected_count",
    "ramp",
    "steps",
]

PROCESSES = ("fixed", "poisson")


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of ``duration`` seconds whose rate goes linearly from ``start`` to ``end``/s.

    ``duration`` may be ``math.inf`` for a constant rate that lasts until the request count
    runs out.
    """

    start: float
    end: float
    duration: float

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < 0 or not (self.start > 0 or self.end > 0):
            raise ValueError("a segment needs rates >= 0, not both zero")
        if not self.duration > 0:
            raise ValueError("a segment needs a positive duration")
        if math.isinf(self.duration) and self.start != self.end:
            raise ValueError("only a constant rate can last forever")

    @property
    def intensity(self) -> float:
        """Expected arrivals in the whole segment."""
        return (self.start + self.end) / 2 * self.duration

    def time_at(self, units: float) -> float:
        """Seconds into the segment at which its cumulative intensity reaches ``units``."""
        if units <= 0:
            return 0.0
        if self.start == self.end:
            return units / self.start
        # Solve start*t + slope/2*t^2 = units in the form that stays exact when start is 0.
        slope = (self.end - self.start) / self.duration
        return 2 * units / (self.start + math.sqrt(self.start**2 + 2 * slope * units))


def steps(rates: Sequence[float], step_duration: float) -> list[Segment]:
    """Constant ``rates``, each held for ``step_duration`` seconds."""
    return [Segment(rate, rate, step_duration) for rate in rates]


def ramp(start: float, end: float, duration: float) -> list[Segment]:
    """One linear ramp from ``start`` to ``end`` requests/s over ``duration`` seconds."""
    return [Segment(start, end, duration)]


def expected_count(segments: Sequence[Segment]) -> float:
    """Expected number of arrivals over all segments (``inf`` for an endless one)."""
    return sum(s.intensity for s in segments)


def arrivals(
    segments: Sequence[Segment], process: str = "fixed", seed: int = 0
) -> Iterator[tuple[float, int]]:
    """Yield ``(seconds from start, segment index)`` for each arrival, in time order.

    ``fixed`` puts the first arrival at 0 and then one per unit of intensity, so a constant
    rate r gives exactly ``k / r``. ``poisson`` draws unit exponential gaps from ``seed``.
    """
    if process not in PROCESSES:
        raise ValueError(f"unknown process {process!r}; choose from {', '.join(PROCESSES)}")
    rng = random.Random(seed)
    poisson = process == "poisson"
    # The running position on the whole load's intensity axis, carried across segments so a
    # step boundary neither drops nor duplicates an arrival.
    position = rng.expovariate(1.0) if poisson else 0.0
    offset_units = 0.0
    offset_time = 0.0
    for index, segment in enumerate(segments):
        units = segment.intensity
        while position - offset_units < units:
            yield offset_time + segment.time_at(position - offset_units), index
            position += rng.expovariate(1.0) if poisson else 1.0
        offset_units += units
        offset_time += segment.duration
