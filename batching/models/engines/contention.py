"""How many cores other work used while batches ran: the event loop of this process answering
a storm of connections, or another process on the machine.

A thread team larger than the cores left free is the slowest choice there is (see
:mod:`.governor`), and trying one costs a batch that runs ten times as long: a batch of requests
past their deadline. So before the governor tries more threads it asks how busy the machine has
been since it last asked: the non-idle time of the CPUs this process may run on, less what the
batches' own threads used, per second of wall time. The kernel's per-CPU counters (psutil) tick
every 10 ms, so a reading covers at least :data:`MIN_WINDOW` seconds; a shorter one returns the
last reading. They are read only when a try is due (about 40 us a read).

Only meaningful when the thread budget is every CPU in the affinity mask: under a CPU quota (a
container on a larger host) the other CPUs' time belongs to other tenants, and nothing is
measured.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import psutil

__all__ = ["MIN_WINDOW", "Contention", "busy_seconds"]

#: The shortest window a reading covers, in seconds (the counters' tick is 10 ms).
MIN_WINDOW = 0.1


def busy_seconds(cpus: Sequence[int]) -> float:
    """Non-idle CPU seconds of ``cpus`` since boot (user, system, interrupts, steal)."""
    times = psutil.cpu_times(percpu=True)
    total = 0.0
    for cpu in cpus:
        if cpu < len(times):
            sample = times[cpu]
            total += sample.user + sample.nice + sample.system
            total += getattr(sample, "irq", 0.0) + getattr(sample, "softirq", 0.0)
            total += getattr(sample, "steal", 0.0)
    return total


class Contention:
    """Cores other work used, on average, since the last reading.

    :param cpus: the CPUs this process may run on.
    :param read: busy seconds of those CPUs (injected in tests).
    :param clock: wall seconds (injected in tests).
    """

    def __init__(
        self,
        cpus: Sequence[int],
        read: Callable[[Sequence[int]], float] = busy_seconds,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cpus = tuple(cpus)
        self._read = read
        self._clock = clock
        self._since = clock()
        self._busy = read(self.cpus)
        self._ours = 0.0
        self._last: float | None = None

    @classmethod
    def for_budget(cls, budget: int) -> Contention | None:
        """A meter for a process whose thread budget is ``budget``; None when the budget is
        not every CPU in the affinity mask (a quota), where the counters would count other
        tenants, or is one CPU (nothing to choose)."""
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return None
        if len(cpus) != budget or budget < 2:
            return None
        return cls(cpus)

    def ran(self, threads: int, seconds: float) -> None:
        """A batch kept ``threads`` threads busy for ``seconds``: not other work."""
        self._ours += threads * seconds

    def others(self) -> float | None:
        """Cores other work used per second since the last reading (the last reading when
        that was under :data:`MIN_WINDOW` ago; None before the first)."""
        now = self._clock()
        if now - self._since < MIN_WINDOW:
            return self._last
        busy = self._read(self.cpus)
        used = (busy - self._busy - self._ours) / (now - self._since)
        self._since, self._busy, self._ours = now, busy, 0.0
        self._last = max(0.0, used)
        return self._last
