"""Memory an idle server gives back: once no batch has run for :data:`IDLE_S` seconds, each
runner that keeps buffers sized for its largest batch releases them (OpenVINO's
``CompiledModel.release_memory``: a batch of 32 texts of 256 tokens leaves ~150 MB of
activations behind), and glibc returns the freed pages to the system (``malloc_trim``). The
next batch allocates again, which costs milliseconds once, after an idle spell. The padded
lengths served are written beside the engine cache then (:mod:`.lengths`), for the next
measurement to time at.

A runner is never released while it runs: the plan holds its ``running`` lock around every
batch, and the release only takes it when free.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
import weakref
from collections.abc import Callable

from .plan import EnginePlan
from .polling import poll

__all__ = ["IDLE_S", "IdleRelease", "trim_heap"]

logger = logging.getLogger("batching.engines")

#: Seconds without a batch before the buffers are released.
IDLE_S = 5.0
#: How often the thread looks.
POLL_S = 1.0


def trim_heap() -> None:
    """glibc's ``malloc_trim(0)``: freed heap pages back to the system (a no-op elsewhere)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


class IdleRelease:
    """Releases ``plan``'s runners' buffers once it has been idle :data:`IDLE_S` seconds,
    once per idle spell.

    :param clock: ``time.monotonic`` (``plan.last_batch_at``'s clock) unless a test injects one.
    :param trim: what returns freed memory to the system.
    """

    def __init__(
        self,
        plan: EnginePlan,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
        trim: Callable[[], None] = trim_heap,
    ) -> None:
        self._plan = weakref.ref(plan)
        self.idle_s = idle_s
        self.clock = clock
        self.trim = trim
        self._released_at: float | None = None  # the plan's last batch when last released
        #: The plan's: closing the plan (its model unloaded) stops the thread.
        self.stopped = plan.closed

    def step(self) -> bool:
        """Release now if it is due; whether the plan is still alive."""
        plan = self._plan()
        if plan is None:
            return False
        last = plan.last_batch_at
        idle = self.clock() - last
        if self._released_at != last and idle >= self.idle_s and plan.release_memory():
            self._released_at = last
            self.trim()
            if plan.lengths.changed and plan.cache_folder is not None:
                plan.lengths.save(plan.cache_folder)
        return True

    def start(self) -> threading.Thread:
        return poll(self.step, self.stopped, POLL_S, "engine-idle")
