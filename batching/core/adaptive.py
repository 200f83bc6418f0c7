"""An adaptive batch window: wait only as long as the traffic makes a bigger batch worth it.

The policy keeps two online estimates, both updated in O(1) from numbers the collector
passes in (it never reads a clock):

**Arrival rate λ** (items/s) is a time-decayed count: each arrival adds its items, and the
count decays as ``exp(-dt / rate_window_s)``, so ``count / rate_window_s`` is the rate over
roughly the last window. Unlike an EWMA of inter-arrival gaps, a burst (many items at one
timestamp) counts as exactly its size rather than as a string of zero gaps that would send
the estimate to infinity, and an idle gap shrinks the estimate by ``exp(-gap / window)``:
after a few windows of silence the next lone request sees λ ≈ 0 and goes out at once. The
estimate is also decayed to ``formation.now`` when the collector asks.

**Batch cost** ``t(n) ≈ a + b·n`` is an exponentially-weighted least-squares fit over the
last ~``cost_memory_batches`` batches (decayed sufficient statistics, so O(1) per batch).
Two pseudo-observations from the prior, at ``n = 1`` and ``n = max_batch_size``, are never
decayed: they keep the fit defined when every batch so far had the same size (light traffic
only ever runs batches of 1), and, weighing 1/1000 of a batch each, real data outweighs them
from the first batch. Each observation's residual against the current prediction is first
clipped Huber-style to ``outlier_threshold`` times the typical residual (an EWMA of clipped
absolute residuals, floored at 1 % of the prediction), so one stall (a GC pause, a page-fault
storm) moves the fit by at most a few typical residuals / ``cost_memory_batches``. A clip
relative to the prediction (``[t̂/k, t̂·k]``) was tried and rejected: one stall on a large
batch then swung the intercept by over 50 %. A genuine change in cost still wins:
persistent clipped residuals grow the typical residual geometrically, so the clip opens
within ~10 batches and the fit then follows at its own memory. ``a`` and ``b`` are
clamped non-negative by refitting with the offending term pinned at zero.

**The decision.** One instance serving its share ``λ_i = λ / instances`` of the traffic
with batches of ``n`` keeps up only if the batch is refilled while it computes:
``λ_i · (a + b·n) ≤ n``, i.e. ``n ≥ n* = λ_i·a / (1 - λ_i·b)`` (``n* = max_batch_size``
when ``λ_i·b ≥ 1``: per-item cost alone saturates the instance). Dispatching fewer than
``n*`` items spends the fixed cost ``a`` on too few items and leaves the instance falling
behind; dispatching more than ``n*`` after waiting for them only adds latency. So:

1. A full batch, or one whose oldest job would already blow the latency budget on compute
   alone (``age + t̂(items) ≥ max_latency``), goes at once.
2. If another instance is idle, go at once: there is spare capacity, and that instance's
   collector has waited on the queue longer, so it would take the next arrival anyway. With
   no backlog and no other instance busy, nothing shows concurrent traffic: go at once too.
   That is right for a lone client (its next request cannot arrive before this answer,
   however high its request rate looks) and for light traffic alike, and it is what keeps
   single-client latency equal to a zero window's.
3. Otherwise the batch waits for the ``n* - items`` more items it lacks, which take about
   ``(n* - items) / λ`` at the full rate λ (while this collector forms, every arrival comes
   to it). If it lacks less than one whole item, waiting buys nothing: go at once. At light
   load ``λ·a ≪ 1`` makes ``n* < 1`` so this is also zero; at heavy load ``n*`` grows to the
   batch cap and the batch waits up to the ceiling.
4. The wait is cut so the oldest job's latency stays within budget counting the items
   expected to join: the deadline ``D`` (from the oldest enqueue time) satisfies
   ``D + t̂(items + λ·(D - age)) ≤ max_latency``, so going at ``D`` with the items present
   then is within budget under the cost model. The collector re-asks after every arrival,
   so more arrivals than expected only pull the deadline in.
5. ``max_queue_delay`` is the hard ceiling; the result is always in ``[0, max_queue_delay]``.

Why not always target ``n*``: when an instance serves continuously, the items that arrive
during one batch's compute already number about ``n*`` (the same fixed point), so a greedy
zero window forms ``n*``-sized batches by itself; the wait only matters when the queue has
run short of ``n*``, and it is then bounded by the time ``n*`` takes to arrive.

The cost model counts items, not padded tokens; ``batch_tokens`` is ignored.
"""

from __future__ import annotations

import math

from .policy import Formation

__all__ = ["AdaptivePolicy"]

#: Weight of each of the cost model's two prior pseudo-observations, in batches.
_PRIOR_WEIGHT = 1e-3
#: EWMA gain of the typical residual: short memory, so a persistent change opens the clip by
#: 1 + gain * (threshold - 1) per batch, while one outlier's lift fades within a few batches.
_RESIDUAL_SCALE_GAIN = 0.2
#: The typical residual never drops below 1 % of the prediction (nor 1 µs), or noiseless
#: data would clip every later observation to nothing and freeze the fit.
_RESIDUAL_FLOOR = 0.01
_RESIDUAL_FLOOR_S = 1e-6


class AdaptivePolicy:
    """Chooses the batch window from an online cost model and the observed arrival rate.

    :param max_queue_delay: hard ceiling on the window, seconds.
    :param max_latency: the oldest job's latency budget (wait + compute), seconds; waiting
        never pushes it past this under the cost model. ``math.inf`` disables the budget.
    :param max_batch_size: the collector's cap on items per batch.
    :param prior_fixed_s: the cost model's fixed term before any batch is observed.
    :param prior_per_item_s: the cost model's per-item term before any batch is observed.
    :param rate_window_s: time constant of the arrival-rate estimate, seconds.
    :param cost_memory_batches: about how many recent batches the cost fit remembers.
    :param outlier_threshold: an observed batch cost's residual is clipped to this many
        typical residuals before it enters the fit.
    """

    def __init__(
        self,
        max_queue_delay: float,
        max_latency: float,
        max_batch_size: int,
        *,
        prior_fixed_s: float = 0.005,
        prior_per_item_s: float = 0.002,
        rate_window_s: float = 0.1,
        cost_memory_batches: int = 50,
        outlier_threshold: float = 3.0,
    ) -> None:
        if not (math.isfinite(max_queue_delay) and max_queue_delay >= 0):
            raise ValueError(f"max_queue_delay must be finite and >= 0, got {max_queue_delay!r}")
        if math.isnan(max_latency) or max_latency <= 0:
            raise ValueError(f"max_latency must be > 0 (math.inf for none), got {max_latency!r}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size!r}")
        if not (math.isfinite(prior_fixed_s) and prior_fixed_s >= 0):
            raise ValueError(f"prior_fixed_s must be finite and >= 0, got {prior_fixed_s!r}")
        if not (math.isfinite(prior_per_item_s) and prior_per_item_s >= 0):
            raise ValueError(f"prior_per_item_s must be finite and >= 0, got {prior_per_item_s!r}")
        if not (math.isfinite(rate_window_s) and rate_window_s > 0):
            raise ValueError(f"rate_window_s must be finite and > 0, got {rate_window_s!r}")
        if cost_memory_batches < 1:
            raise ValueError(f"cost_memory_batches must be >= 1, got {cost_memory_batches!r}")
        if not (math.isfinite(outlier_threshold) and outlier_threshold > 0):
            raise ValueError(f"outlier_threshold must be finite and > 0, got {outlier_threshold!r}")
        self._max_queue_delay = float(max_queue_delay)
        self._max_latency = float(max_latency)
        self._max_batch_size = int(max_batch_size)
        self._rate_window_s = float(rate_window_s)
        self._outlier_threshold = float(outlier_threshold)
        # Typical absolute residual of the fit; None until the first batch, which is taken
        # unclipped because the prior may be off by any factor.
        self._residual_scale: float | None = None
        # Weight kept per batch: memory 1 / (1 - decay) batches.
        self._cost_decay = 1.0 - 1.0 / cost_memory_batches

        # Arrival rate state: decayed item count as of _last_arrival.
        self._arrival_count = 0.0
        self._last_arrival: float | None = None

        # Prior pseudo-observations at two distinct sizes, so the 2x2 system is never singular
        # even when every real batch has the same size. Their weight only has to break that
        # tie: with two distinct sizes the fit passes through both whatever the weight, and a
        # light prior leaves no measurable bias once real batches arrive.
        big = float(max(2, max_batch_size))
        t_small = prior_fixed_s + prior_per_item_s
        t_big = prior_fixed_s + prior_per_item_s * big
        w = _PRIOR_WEIGHT
        self._prior_sums = (
            2.0 * w,
            w * (1.0 + big),
            w * (1.0 + big * big),
            w * (t_small + t_big),
            w * (t_small + big * t_big),
        )
        # Decayed sums over observed batches: weight, n, n^2, t, n*t.
        self._s0 = 0.0
        self._sn = 0.0
        self._snn = 0.0
        self._st = 0.0
        self._snt = 0.0
        self._fixed_s = float(prior_fixed_s)
        self._per_item_s = float(prior_per_item_s)

    # Observability -------------------------------------------------------------------------

    @property
    def arrival_rate(self) -> float:
        """Estimated arrival rate in items/s, as of the last observed arrival."""
        return self._arrival_count / self._rate_window_s

    @property
    def cost_fixed_s(self) -> float:
        """Fitted fixed cost ``a`` of a batch, seconds."""
        return self._fixed_s

    @property
    def cost_per_item_s(self) -> float:
        """Fitted per-item cost ``b`` of a batch, seconds."""
        return self._per_item_s

    @property
    def max_queue_delay(self) -> float:
        """The hard ceiling on the window, seconds."""
        return self._max_queue_delay

    @property
    def max_latency(self) -> float:
        """The oldest job's latency budget, seconds."""
        return self._max_latency

    def predicted_cost(self, items: int) -> float:
        """The cost model's estimate for a batch of ``items``, seconds."""
        return self._fixed_s + self._per_item_s * items

    # Observations --------------------------------------------------------------------------

    def observe_arrival(self, now: float, items: int) -> None:
        if items <= 0 or not math.isfinite(now):
            return
        last = self._last_arrival
        if last is None:
            self._last_arrival = now
        elif now > last:
            self._arrival_count *= math.exp((last - now) / self._rate_window_s)
            self._last_arrival = now
        # An arrival stamped earlier than the last one (two clocks' worth of jitter) still
        # counts; it just does not move time backwards.
        self._arrival_count += items

    def observe_batch(self, items: int, tokens: int, compute_s: float) -> None:
        if items <= 0 or not math.isfinite(compute_s) or compute_s < 0:
            return
        n = float(items)
        predicted = self._fixed_s + self._per_item_s * n
        residual = compute_s - predicted
        scale = self._residual_scale
        if scale is None:
            self._residual_scale = abs(residual)
        else:
            limit = self._outlier_threshold * max(
                scale, _RESIDUAL_FLOOR * predicted, _RESIDUAL_FLOOR_S
            )
            residual = min(max(residual, -limit), limit)
            self._residual_scale = scale + _RESIDUAL_SCALE_GAIN * (abs(residual) - scale)
        t = predicted + residual
        d = self._cost_decay
        self._s0 = self._s0 * d + 1.0
        self._sn = self._sn * d + n
        self._snn = self._snn * d + n * n
        self._st = self._st * d + t
        self._snt = self._snt * d + n * t
        self._refit()

    def _refit(self) -> None:
        p0, pn, pnn, pt, pnt = self._prior_sums
        s0 = p0 + self._s0
        sn = pn + self._sn
        snn = pnn + self._snn
        st = pt + self._st
        snt = pnt + self._snt
        det = s0 * snn - sn * sn
        # The prior's two distinct sizes make det > 0; the guard is for float cancellation.
        if det > 1e-12 * s0 * snn:
            b = (s0 * snt - sn * st) / det
            a = (st - b * sn) / s0
        else:
            b = self._per_item_s
            a = (st - b * sn) / s0
        # A negative term is unphysical (noise on near-flat data): pin it at zero and refit
        # the other one alone, rather than clamping and keeping a line that misses the data.
        if b < 0:
            b = 0.0
            a = st / s0
        if a < 0:
            a = 0.0
            b = snt / snn
        self._fixed_s = a
        self._per_item_s = b

    # Decision ------------------------------------------------------------------------------

    def rate_at(self, now: float) -> float:
        """The arrival-rate estimate decayed to ``now``, items/s."""
        last = self._last_arrival
        if last is None:
            return 0.0
        count = self._arrival_count
        if now > last:
            count *= math.exp((last - now) / self._rate_window_s)
        return count / self._rate_window_s

    def target_batch_items(self, rate: float, instances: int) -> float:
        """``n*``: the batch size at which one instance's share of ``rate`` refills it."""
        share = rate / max(1, instances)
        a = self._fixed_s
        b = self._per_item_s
        cap = float(self._max_batch_size)
        if share * b >= 1.0:
            return cap
        return min(cap, share * a / (1.0 - share * b))

    def max_delay(self, formation: Formation) -> float:
        cap = self._max_queue_delay
        batch_cap = max(1, min(formation.max_batch_size, self._max_batch_size))
        items = max(1, formation.batch_items)
        if cap <= 0.0 or items >= batch_cap:
            return 0.0
        # `now` can trail `oldest` by clock jitter; an age below zero means "just arrived".
        age = max(0.0, formation.now - formation.oldest_enqueued_at)
        a = self._fixed_s
        b = self._per_item_s
        budget = self._max_latency
        if age + a + b * items >= budget:
            return 0.0
        instances = max(1, formation.instances)
        busy = max(0, formation.busy_instances)
        # An idle peer means spare capacity now, and it would take the next arrival anyway
        # (it has waited on the queue longer than this collector).
        if busy < instances - 1:
            return 0.0
        if not formation.backlog and busy == 0:
            return 0.0
        rate = self.rate_at(formation.now)
        target = min(self.target_batch_items(rate, instances), float(batch_cap))
        missing = target - items
        if missing < 1.0:
            return 0.0
        # rate > 0 here: target >= 2 needs a positive rate.
        deadline = age + missing / rate
        # Largest D with D + a + b * (items + rate * (D - age)) <= budget.
        if math.isfinite(budget):
            deadline = min(deadline, (budget - a - b * items + b * rate * age) / (1.0 + b * rate))
        delay = min(deadline, cap)
        # `not delay > 0` also catches NaN from pathological inputs.
        if not delay > 0.0:
            return 0.0
        return delay
