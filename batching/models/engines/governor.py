"""How many threads a batch runs on, learned from the batches themselves.

A thread team as large as the CPU budget is fastest on quiet cores. Beside other work (a
process that keeps one of two cores busy, the event loop answering a burst), it is the
slowest choice there is: every barrier waits for the thread the scheduler parked, and batches
take ten times as long. One thread barely notices. Which is faster depends on what else runs,
which changes while the server runs, so the :class:`ThreadGovernor` measures it: it runs each
batch on the thread count that has been cheapest for batches of that size, and now and then
tries another one on a real batch. A try that turns out cheaper switches at once; one that
does not waits twice as long before the next (and longer the dearer the try was), so on a
machine whose answer does not change the tries cost almost nothing.

A try of more threads than the cores other work left free is not made: it would run ten times
as long, past its requests' deadlines (a storm of connections keeps the event loop on one of
two cores). Given a meter of that other work (:mod:`.contention`), the governor waits until
the cores are free again and tries then.

Cost is seconds per token (the batch's items times its padded length), compared only between
batches of similar size (a power-of-two bucket), since a batch of one costs more per token
than a batch of 32 whatever the threads. Pure arithmetic: the clock is the caller's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "FIRST_INTERVAL",
    "GAP_PER_COST",
    "LAST_INTERVAL",
    "MARGIN",
    "ThreadGovernor",
    "thread_choices",
]

#: Batches between two tries, at first and after a try that switched.
FIRST_INTERVAL = 8
#: The longest gap between two tries (it doubles after each try that did not switch): the
#: cost of trying a slow choice is at most one batch in this many.
LAST_INTERVAL = 256
#: Batches to wait after a failed try, per unit of what the try cost relative to a batch on
#: the current choice: tries then take at most about 1 / GAP_PER_COST of the time.
GAP_PER_COST = 32
#: A choice must be this much cheaper to replace the current one.
MARGIN = 0.1
#: Weight of the newest batch in a choice's smoothed cost.
SMOOTHING = 0.3
#: Cores of other work a try of more threads tolerates beyond those its team leaves free.
CROWDING = 0.5


def thread_choices(budget: int) -> tuple[int, ...]:
    """The thread counts worth trying on ``budget`` cores: all of them, half, and one."""
    return tuple(sorted({max(1, budget), max(1, budget // 2), 1}, reverse=True))


@dataclass(slots=True)
class _Bucket:
    current: int
    costs: dict[int, float] = field(default_factory=dict)
    since_try: int = 0
    interval: int = FIRST_INTERVAL
    next_try: int = 0  # index into the choices, for taking turns


class ThreadGovernor:
    """Picks the thread count of each batch and learns from how long it took.

    :param choices: thread counts, largest first (the first is where every size starts).
    :param others: cores other work has used lately (:meth:`.contention.Contention.others`);
        asked only when a try of more threads is due. None: tries are never held back.
    """

    def __init__(
        self,
        choices: tuple[int, ...],
        others: Callable[[], float | None] | None = None,
    ) -> None:
        if not choices or any(count < 1 for count in choices):
            raise ValueError(f"thread choices must be positive, not {choices}")
        self.choices = choices
        self._others = others
        self._budget = max(choices)
        self._buckets: dict[int, _Bucket] = {}
        #: Tries held back because other work kept the cores a larger team needs.
        self.held_back = 0

    @property
    def adaptive(self) -> bool:
        return len(self.choices) > 1

    def pick(self, items: int, at_most: int | None = None) -> int:
        """The thread count for a batch of ``items`` items, no more than ``at_most`` (the
        threads the batch was lent: :mod:`.cores`) where that is given."""
        chosen = self._pick(items)
        if at_most is None or chosen <= at_most:
            return chosen
        return max((count for count in self.choices if count <= at_most), default=1)

    def _pick(self, items: int) -> int:
        bucket = self._bucket(items)
        if not self.adaptive:
            return bucket.current
        if bucket.since_try >= bucket.interval:
            others = [count for count in self.choices if count != bucket.current]
            candidate = others[bucket.next_try % len(others)]
            if candidate > bucket.current and self._crowded(candidate):
                # Due, but it would run on cores that are not free: try when they are.
                self.held_back += 1
                return bucket.current
            bucket.next_try += 1
            return candidate
        return bucket.current

    def _crowded(self, threads: int) -> bool:
        """Whether other work lately used cores a team of ``threads`` would need."""
        if self._others is None:
            return False
        used = self._others()
        return used is not None and used > self._budget - threads + CROWDING

    def observe(self, items: int, tokens: int, threads: int, seconds: float) -> None:
        """A batch of ``items`` items and ``tokens`` tokens took ``seconds`` on ``threads``."""
        if tokens <= 0 or seconds <= 0 or threads not in self.choices:
            return
        bucket = self._bucket(items)
        cost = seconds / tokens
        if threads == bucket.current:
            previous = bucket.costs.get(threads)
            smoothed = cost if previous is None else previous + SMOOTHING * (cost - previous)
            bucket.costs[threads] = smoothed
            bucket.since_try += 1
            others = [c for count, c in bucket.costs.items() if count != threads]
            if others and smoothed * (1 - MARGIN) > min(others):
                # This choice now costs more than another did when last tried (another
                # process took a core?): try it on the next batch rather than after the gap.
                # The smoothed cost, not this batch's alone: batches of one size bucket vary
                # in cost per token (prompts of different lengths), and one dear batch among
                # cheap ones is not a competitor.
                bucket.since_try = max(bucket.since_try, bucket.interval)
            return
        # A try (or a first measurement): what this choice costs now replaces what it cost
        # when last tried, which may be long ago and under other load.
        bucket.costs[threads] = cost
        bucket.since_try = 0
        current = bucket.costs.get(bucket.current, float("inf"))
        if cost < current * (1 - MARGIN):
            bucket.current = threads
            bucket.interval = FIRST_INTERVAL
        elif len(bucket.costs) == len(self.choices):
            # A try that cost k batches' worth waits at least k * GAP_PER_COST batches for
            # the next: beside a competitor a two-thread try can cost ten one-thread batches.
            gap = math.ceil(cost / current * GAP_PER_COST)
            bucket.interval = min(LAST_INTERVAL, max(bucket.interval * 2, gap))

    def current(self, items: int) -> int:
        """The thread count batches of ``items`` items run on between tries."""
        return self._bucket(items).current

    def in_use(self) -> set[int]:
        """The thread counts some batch size runs on between tries (the first if none ran)."""
        return {bucket.current for bucket in self._buckets.values()} or {self.choices[0]}

    def describe(self) -> dict[str, object]:
        """Per size bucket (largest batch size in it): the current choice and the smoothed
        cost of each choice in microseconds per token."""
        return {
            f"<={(1 << key) - 1}": {
                "threads": bucket.current,
                "us_per_token": {
                    str(count): round(cost * 1e6, 2) for count, cost in bucket.costs.items()
                },
            }
            for key, bucket in sorted(self._buckets.items())
        }

    def _bucket(self, items: int) -> _Bucket:
        key = max(1, items).bit_length()
        bucket = self._buckets.get(key)
        if bucket is None:
            # A size not seen yet starts where the nearest size seen runs now: what else
            # runs on the machine matters to both.
            nearest = min(self._buckets, key=lambda other: abs(other - key), default=None)
            start = self.choices[0] if nearest is None else self._buckets[nearest].current
            bucket = self._buckets[key] = _Bucket(current=start)
        return bucket
