"""Admission: whether a request may join a model's queue, decided before it is queued.

Two rules, both pure arithmetic over the queue's state and the measured throughput:

- the queue-depth circuit breaker opens when the queue would pass ``max_queue_size`` items and
  closes again only once the queue has fallen to ``queue_close_ratio`` of it, so it cannot flap;
- a request whose predicted wait (the work queued and running ahead of it, at the measured
  rate, times :data:`ADMISSION_MARGIN`) would not fit before its deadline is refused at once,
  instead of being accepted only to time out.
"""

from __future__ import annotations

import math

from batching.errors import Overloaded

from .config import BatchingConfig
from .events import BatchEvents

__all__ = ["ADMISSION_MARGIN", "Admission", "Throughput"]

#: Admit a request only if its predicted wait, times this, fits before its deadline.
ADMISSION_MARGIN = 2.0


class Throughput:
    """Items per second one instance completes, smoothed: feeds Retry-After and
    predicted-wait admission."""

    def __init__(self, prior: float = 100.0) -> None:
        self.per_instance = prior

    def observe(self, items: int, compute_s: float) -> None:
        if compute_s <= 0:
            return
        rate = items / compute_s
        # Batches of one understate what a busy instance does; weight by batch size.
        weight = min(0.5, 0.05 * items)
        self.per_instance += weight * (rate - self.per_instance)


class Admission:
    """The breaker and the deadline-fit rule for one model's queue.

    :param name: the model's name, for messages.
    :param config: the queue bound, close ratio and item caps.
    :param events: told the reason of every refusal.
    """

    def __init__(self, name: str, config: BatchingConfig, events: BatchEvents) -> None:
        self.name = name
        self.config = config
        self.events = events
        self.throughput = Throughput()
        self.breaker_open = False

    def check(
        self, count: int, *, queued: int, running: int, instances: int, time_left: float
    ) -> None:
        """Admit ``count`` items with ``queued`` items waiting and ``running`` in batches on
        ``instances`` ready instances, ``time_left`` seconds before the request's deadline.

        :raises Overloaded: the breaker is open, or the request cannot be served in time.
        """
        config = self.config
        capacity = self.throughput.per_instance * max(1, instances)
        if self.breaker_open and queued <= config.max_queue_size * config.queue_close_ratio:
            self.breaker_open = False
        if queued + count > config.max_queue_size:
            self.breaker_open = True
        if self.breaker_open:
            self.events.rejected("overloaded")
            raise Overloaded(
                f"model {self.name!r} is overloaded: {queued} items queued",
                retry_after=retry_after(queued, capacity),
            )
        # The work ahead of this request (queued and running), at the measured rate, must
        # fit in its deadline with room to spare: the rate is an estimate, and a request let
        # in at the margin would only wait to time out. Saying no now lets a retry succeed.
        ahead = queued + running
        expected = (ahead + count) / capacity
        if ahead > 0 and expected * ADMISSION_MARGIN > time_left:
            self.events.rejected("deadline")
            raise Overloaded(
                f"model {self.name!r} cannot serve this request before its deadline: "
                f"{queued} items are queued ahead of it",
                retry_after=retry_after(queued, capacity),
            )


def retry_after(depth: int, capacity: float) -> float:
    """Seconds a refused client should wait: the queue's drain time, at least one."""
    return max(1.0, math.ceil(depth / capacity))
