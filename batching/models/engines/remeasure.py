"""Busy measurements taken again: a background thread that waits until the server has been
idle (no batch for a while), measures the variants again in a child process, and swaps the
new choice into the plan between two batches. Traffic is never held: batches keep running on
the old runners while the child measures (a batch that arrives meanwhile makes the retake
busy again, and it is retried later, after a longer idle spell: :class:`~.decision.RetakeRule`).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable

from ..loading import LOADING
from .decision import BUSY_CORES, RetakeRule, others_cores
from .measure import cpu_seconds
from .plan import EnginePlan
from .polling import poll

__all__ = ["Retaker"]

logger = logging.getLogger("batching.engines")

#: How often the thread looks at the plan's idle time.
POLL_S = 5.0
#: Other processes must have left the cores quiet this long before a retake: a machine
#: between two bursts of other work is not quiet.
QUIET_S = 10.0


class Retaker:
    """Retakes ``plan``'s busy measurements with ``remeasure`` (which returns the plan of the
    new decision, or None) once :class:`RetakeRule` says so.

    :param clock: ``time.monotonic`` unless a test injects one; ``plan.last_batch_at`` is on
        the same clock.
    :param load: the machine's and this process's CPU seconds (:func:`~.measure.cpu_seconds`),
        read at each step: whether other processes keep the cores busy now.
    :param quiet_s: how long they must have left the cores quiet (:data:`QUIET_S`).
    """

    def __init__(
        self,
        plan: EnginePlan,
        remeasure: Callable[[], EnginePlan | None],
        rule: RetakeRule | None = None,
        clock: Callable[[], float] = time.monotonic,
        load: Callable[[], tuple[float, float]] = cpu_seconds,
        quiet_s: float = QUIET_S,
    ) -> None:
        self._plan = weakref.ref(plan)
        self.remeasure = remeasure
        self.rule = rule or RetakeRule()
        self.clock = clock
        self.load = load
        #: The plan's: closing the plan (its model unloaded) stops the thread. The thread holds
        #: the model through ``remeasure``, so the plan would never be collected while it runs.
        self.stopped = plan.closed
        self._last = (clock(), *load())
        self._quiet_since: float | None = None
        self.quiet_s = quiet_s

    def step(self) -> bool:
        """Retake now if it is due; whether there is anything left to do."""
        plan = self._plan()
        if plan is None or plan.closed.is_set() or not plan.decision.busy:
            return False
        now, (machine, own) = self.clock(), self.load()
        then, machine_then, own_then = self._last
        self._last = (now, machine, own)
        others = others_cores(machine - machine_then, own - own_then, now - then)
        if others >= BUSY_CORES:
            self._quiet_since = None
        elif self._quiet_since is None:
            self._quiet_since = then
        if self._quiet_since is None or now - self._quiet_since < self.quiet_s:
            others = max(others, BUSY_CORES)  # not quiet for long enough yet
        if not self.rule.due(True, now, plan.last_batch_at, others):
            return True
        before = plan.decision
        # Not beside a model's load: its imports, and its use of the cores.
        with LOADING.turn("engines measured again"):
            try:
                fresh = self.remeasure()
            except Exception as exc:
                logger.warning("measuring the engines again failed: %s", exc)
                fresh = None
            if plan.closed.is_set():
                return False  # unloaded while it measured: nothing serves with it any more
            if fresh is None:
                self.rule.taken(still_busy=True)
                return True
            same = [r.to_json() for r in fresh.decision.routes] == [
                r.to_json() for r in before.routes
            ]
            if same:
                plan.decision = fresh.decision  # the same runners: keep those already built
            else:
                plan.replace(fresh)
        self.rule.taken(still_busy=fresh.decision.busy)
        logger.info(
            "engines measured again%s: %s",
            " (busy again: retried after a longer idle spell)" if fresh.decision.busy else "",
            fresh.decision.describe(),
        )
        return fresh.decision.busy

    def start(self) -> threading.Thread:
        return poll(self.step, self.stopped, POLL_S, "engine-retake")
