"""Admission: whether a request may join a model's queue, decided before it is queued.

Two rules, both pure arithmetic over the queue's state and the measured throughput:

- the queue-depth circuit breaker opens when the queue would pass ``max_queue_size`` items and
  closes again only once the queue has fallen to ``queue_close_ratio`` of it, so it cannot flap;
- a request whose predicted wait (the work queued and running ahead of it, at the measured
  rate, times :data:`ADMISSION_MARGIN`) would not fit before its deadline is refused at once,
  instead of being accepted only to time out. A request that joins the next batch (little
  is queued) is held to the prediction without the margin: the margin covers the error of a
  long prediction, and refusing there only turns a free instance away.

No rule can spiral under a retry storm: the throughput estimate learns only from completed
batches that show a busy instance (never from refusals, nor from the few-item batches that
form while most requests are refused), so refusals cannot lower it and make more refusals.
It is the lower of the compute rate and the rate batches actually complete at while work
waits (:class:`Throughput`): when refusals take the event loop's CPU and batches go out
late, admission plans with what the instance delivers, and what it admits still fits.
Retry-After hints are spread between the queue's drain time and twice it, so clients that
honour them come back spread out rather than all at once. Every refusal also says how long
the queue needs before it could take the request (:func:`hold_for`): the HTTP edge holds an
identical request sent again from the same client address before then (on any connection), so
clients that resend at once wait without costing the server a refusal each. That time counts
the requests refused before it too (:class:`ReturnLine`): under a storm every refused client
comes back, and a hold that counted only the queue would release them all at once into a
queue with room for a few, to be refused again, each refusal costing CPU the model needs.
"""

from __future__ import annotations

import math
import random

from batching.errors import Overloaded

from .batching_config import BatchingConfig
from .events import BatchEvents

__all__ = [
    "ADMISSION_MARGIN",
    "MIN_HOLD",
    "Admission",
    "ReturnLine",
    "Throughput",
    "hold_for",
    "retry_after",
    "spread",
]

#: Admit a request only if its predicted wait, times this, fits before its deadline.
ADMISSION_MARGIN = 2.0


#: The shortest hold of an early resend, seconds: about one small batch.
MIN_HOLD = 0.01


#: Weight of one batch in the smoothed throughput: about the last ten batches count.
LEARNING_RATE = 0.2


class Throughput:
    """Items per second one instance completes, smoothed: feeds Retry-After and
    predicted-wait admission.

    Two rates are learnt, and the lower one counts:

    - ``computed``: items per second of the model's own compute time. The batcher reports
      only batches that show a busy instance (full, or at least half the batch cap): a batch
      of a few items costs nearly as much as a full one, so its items/s understates capacity
      several times over.
    - ``served``: items per second of wall-clock time from one batch's end to the next, over
      stretches where work was waiting all along (the same busy batches only). That is what
      a queued request actually sees: besides compute it counts the time the batch took to
      be formed and dispatched, which grows when the event loop is short of CPU (thousands
      of refusals a second on the same cores), and then admitting at the compute rate lets
      in requests that only wait to miss their deadline.
    """

    def __init__(self, prior: float = 100.0) -> None:
        self.computed = prior
        self.served: float | None = None
        #: Wall seconds of one batch, from its start on the loop to its end, smoothed over
        #: every batch whatever its size, and their smoothed deviation from it. 0 until a
        #: batch has run.
        self.batch_mean = 0.0
        self.batch_deviation = 0.0

    @property
    def per_instance(self) -> float:
        """The rate admission plans with: the lower of the two."""
        if self.served is None:
            return self.computed
        return min(self.computed, self.served)

    @per_instance.setter
    def per_instance(self, rate: float) -> None:
        """Start over from ``rate`` (tests set it): the compute rate, nothing served yet."""
        self.computed = rate
        self.served = None

    def observe(self, items: int, compute_s: float) -> None:
        """A completed batch of ``items`` took ``compute_s`` seconds on one instance."""
        if compute_s <= 0 or items <= 0:
            return
        rate = items / compute_s
        self.computed += LEARNING_RATE * (rate - self.computed)

    @property
    def batch_s(self) -> float:
        """How long a batch may take: the smoothed wall time plus twice its smoothed
        deviation (as TCP bounds a round trip), since a request must fit the slow batches
        as well as the average one."""
        return self.batch_mean + 2 * self.batch_deviation

    def observe_batch(self, wall_s: float) -> None:
        """A batch (of any size) took ``wall_s`` seconds from its start to its end."""
        if wall_s <= 0:
            return
        if self.batch_mean == 0.0:
            self.batch_mean = wall_s
            self.batch_deviation = wall_s / 2
            return
        error = wall_s - self.batch_mean
        self.batch_mean += LEARNING_RATE * error
        self.batch_deviation += LEARNING_RATE * (abs(error) - self.batch_deviation)

    def observe_served(self, items: int, wall_s: float) -> None:
        """A batch of ``items`` completed ``wall_s`` seconds after the instance's previous
        batch, with work waiting for the instance all that time."""
        if wall_s <= 0 or items <= 0:
            return
        rate = items / wall_s
        if self.served is None:
            self.served = rate
        else:
            self.served += LEARNING_RATE * (rate - self.served)


class ReturnLine:
    """The items refused lately that are expected back, as a line served at the model's rate.

    Each refusal joins the back of the line; the line drains at the capacity admission plans
    with, so a refused request's place in it is how long until the queue could take it after
    the requests refused before it. One number and a timestamp: a refusal keeps no memory.
    """

    def __init__(self) -> None:
        self.items = 0.0
        self._at: float | None = None

    def join(self, count: int, capacity: float, now: float) -> float:
        """``count`` items refused at ``now``: the seconds until the line ahead of them is
        served at ``capacity`` items per second."""
        if self._at is not None:
            self.items = max(0.0, self.items - capacity * max(0.0, now - self._at))
        self._at = now
        ahead = self.items / capacity
        self.items += count
        return ahead


class Admission:
    """The breaker and the deadline-fit rule for one model's queue.

    :param name: the model's name, for messages.
    :param config: the queue bound, close ratio and item caps.
    :param events: told the reason of every refusal.
    """

    def __init__(
        self,
        name: str,
        config: BatchingConfig,
        events: BatchEvents,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.events = events
        self.throughput = Throughput()
        self.breaker_open = False
        self.rng = rng or random.Random()
        self.returning = ReturnLine()

    def check(
        self,
        count: int,
        *,
        queued: int,
        running: int,
        instances: int,
        time_left: float,
        now: float | None = None,
        busy_since: float | None = None,
    ) -> None:
        """Admit ``count`` items with ``queued`` items waiting and ``running`` in batches on
        ``instances`` ready instances, ``time_left`` seconds before the request's deadline;
        ``now`` (the loop's time) places a refusal in the :class:`ReturnLine`;
        ``busy_since``, when every instance is running a batch, is when the oldest of those
        batches started.

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
            # It could join once the queue has fallen to where the breaker closes.
            excess = queued - config.max_queue_size * config.queue_close_ratio
            raise self._refusal(
                f"model {self.name!r} is overloaded: {queued} items queued",
                queued,
                capacity,
                max(excess, config.max_batch_size) / capacity,
                count,
                now,
            )
        # The work ahead of this request (queued and running), at the measured rate, must
        # fit in its deadline with room to spare: the rate is an estimate, and a request let
        # in at the margin would only wait to time out. Saying no now lets a retry succeed.
        # A request that joins the next batch needs no margin: its wait is one batch.
        ahead = queued + running
        expected = (ahead + count) / capacity
        if busy_since is not None and now is not None:
            # Whatever the rate, it waits for a running batch to end, then for the batches up
            # to its own to form and run: when the cores are short (the loop busy refusing a
            # storm), batches slow down before the busy-batch rates can tell, and a 504 would.
            batch_s = self.throughput.batch_s
            left = max(0.0, busy_since + batch_s - now)
            # The batches queued ahead of it too, its own among them.
            batches = math.ceil((queued + count) / (config.max_batch_size * max(1, instances)))
            expected = max(expected, left + batches * (config.max_queue_delay + batch_s))
        next_batch = queued + count <= config.max_batch_size * max(1, instances)
        margin = 1.0 if next_batch else ADMISSION_MARGIN
        if ahead > 0 and expected * margin > time_left:
            self.events.rejected("would_miss_deadline")
            raise self._refusal(
                f"model {self.name!r} cannot serve this request before its deadline: "
                f"{queued} items are queued ahead of it",
                queued,
                capacity,
                # The work ahead of it drains in this long (at least one batch): held that
                # long, the clients refused together come back as the room they need frees.
                max(ahead, config.max_batch_size) / capacity,
                count,
                now,
            )

    def _refusal(
        self,
        message: str,
        queued: int,
        capacity: float,
        drain_s: float,
        count: int,
        now: float | None,
    ) -> Overloaded:
        hint = spread(retry_after(queued, capacity), self.rng)
        hold = hold_for(drain_s, hint, self.rng)
        if now is not None:
            # Behind the requests refused before it, which come back as well.
            line_s = drain_s + self.returning.join(count, capacity, now)
            hold = min(hint, max(hold, line_s))
        return Overloaded(message, retry_after=hint, hold=hold)


def retry_after(depth: int, capacity: float) -> float:
    """Seconds a refused client should wait: the queue's drain time, at least one."""
    return max(1.0, math.ceil(depth / capacity))


def hold_for(drain_s: float, retry_after_s: float, rng: random.Random) -> float:
    """How long to hold an early resend of a refused request: the time until the queue could
    take it (``drain_s``, at least :data:`MIN_HOLD`), spread like Retry-After so that the held
    requests do not all come back in the same instant, and never past ``retry_after_s``."""
    return min(retry_after_s, spread(max(MIN_HOLD, drain_s), rng))


def spread(seconds: float, rng: random.Random) -> float:
    """``seconds`` to twice it, uniformly: refused together, clients that honour the hint
    come back spread over a drain time instead of all in the same instant."""
    return seconds * (1.0 + rng.random())
