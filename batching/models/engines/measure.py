"""Timing a variant and the memory it adds: what ``auto`` decides on."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import psutil

__all__ = ["BUDGET_S", "REPEATS", "cpu_seconds", "grown_mb", "items_per_second", "resident_mb"]

#: Timed runs per batch size, after one untimed run; the median counts.
REPEATS = 3
#: ... fewer once the timed runs took this long (a long batch varies little run to run).
BUDGET_S = 0.5


def resident_mb() -> float | None:
    """This process's resident memory in MB (Linux); None where it cannot be read."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            pages = int(handle.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def grown_mb(before: float | None) -> float | None:
    """How many MB this process's resident memory grew since it was ``before`` MB (at least
    0); None where it cannot be read."""
    after = resident_mb()
    if before is None or after is None:
        return None
    return max(0.0, after - before)


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds so far: the whole machine's busy time (every core, every process), and
    this process's own (all its threads). Their differences over a timing say how much other
    processes ran meanwhile."""
    machine = psutil.cpu_times()
    busy = sum(
        getattr(machine, name, 0.0)
        for name in ("user", "nice", "system", "irq", "softirq", "steal")
    )
    own = os.times()
    return busy, own.user + own.system


def items_per_second(
    run: Callable[[], object], size: int, repeats: int = REPEATS, budget_s: float = BUDGET_S
) -> float:
    """Items per second of ``run`` (one batch of ``size`` items): one untimed run (lazy set-up
    and first-shape compilation land there), then the median of ``repeats`` timed runs, or of
    those done when they add up to ``budget_s`` (at least one)."""
    run()
    times: list[float] = []
    while len(times) < repeats and (not times or sum(times) < budget_s):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return size / max(statistics.median(times), 1e-9)
