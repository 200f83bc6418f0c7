"""The CPU's cores, shared out among the models of one server as they compute.

Every model's batches (and every step of a decode loop) run on a team of threads. A team as
large as the cores is fastest when it runs alone; two such teams at once, of two models, fight
over the same cores, and every barrier of each waits for a thread the scheduler parked: batches
then take several times as long as on half the threads. Splitting the cores once and for all
(one each) wastes half the machine whenever only one model has work, which is most of the time.

So the cores are lent per computation. Before a batch runs, its instance *takes* threads from
:data:`CORES`; it gets as many as it asks for (its thread budget, normally every core) when
they are free and nobody else needs them, and gives them back when the batch is done. The
threads lent at any moment never add up to more than the cores, so teams never oversubscribe
them. When several models are busy, each gets its **share**: ``cores x its weight / the weights
of the models busy now`` (at least one thread), so that with two busy models of equal weight
on two cores each computes on one, and one model's load cannot take the other's cores. A
model's share is split again among its own computations at that moment (two instances of it,
both busy, get half of it each). A model
counts as busy while it computes or waits, and for :data:`RECENT_S` after (between two of its
batches, so the share does not flap). Models wait in turn for cores that are not free: first
come, first served, and none longer than :data:`PATIENCE_S`: a computation that holds its
cores that long is stuck (or huge), and the others run beside it on one thread each.

A model's weight is its ``cpu_share`` (the model repository's key; 1 by default). What a batch
got is :meth:`Cores.granted` on its thread: the thread governor of the engines and of the
decode loop pick at most that many (:mod:`.engines.plan`, :mod:`.decoding`), and a model that
computes through torch's default team has torch's thread count set to it
(:func:`torch_threads`), so custom and pipeline models share the cores too.

The pool is this process's: process instances have cores of their own (server.py divides the
CPU budget between the process instances and the threads of this process).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["CORES", "PATIENCE_S", "RECENT_S", "Cores", "Party", "torch_threads"]

#: How long after its last batch a model still counts as busy, in seconds.
RECENT_S = 0.1
#: The longest a computation waits for cores, in seconds. Batches and steps take
#: milliseconds; one that holds its cores longer is stuck or huge, and the others then run
#: beside it on a thread each rather than wait behind it (a model that hangs must not hang
#: the rest of the server).
PATIENCE_S = 1.0


def torch_threads(count: int) -> None:
    """Torch's intra-op threads on the calling thread set to ``count``, where torch is loaded
    (a model that computes through torch's default team, a custom class's included). Looked
    up, not imported: a server whose models do not use torch never loads it."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != count:
        torch.set_num_threads(count)


@dataclass(slots=True)
class Party:
    """One model's handle on the pool: its name and weight (its ``cpu_share``)."""

    pool: Cores
    name: str
    weight: float = 1.0
    #: Threads lent to its computations now.
    holding: int = 0
    #: Its computations holding threads now, and those waiting for some.
    running: int = 0
    waiting: int = 0
    last_release: float = field(default=float("-inf"))

    @contextmanager
    def take(self, wanted: int, at_least: int = 1) -> Iterator[int]:
        """Hold up to ``wanted`` threads (at least ``at_least``) for a computation; yields how
        many were granted. Reentrant on one thread: a nested take yields the outer grant."""
        with self.pool.take(self, wanted, at_least) as granted:
            yield granted


class Cores:
    """A pool of ``count`` cores (None: :func:`~.engines.options.thread_budget`, read on first
    use) lent to the models' computations.

    :param clock: monotonic seconds (injected in tests).
    """

    def __init__(
        self, count: int | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._count = count
        self._clock = clock
        self._lock = threading.Condition()
        self._lent = 0
        self._queue: deque[object] = deque()
        self._parties: dict[str, Party] = {}
        self._local = threading.local()
        #: Called with the granted count on the computing thread before it computes.
        self.on_grant: Callable[[int], None] = torch_threads
        #: Told a model's name when one of its computations has to wait for cores.
        self.on_wait: Callable[[str], None] | None = None

    @property
    def count(self) -> int:
        if self._count is None:
            from .engine_options import thread_budget

            self._count = thread_budget()
        return self._count

    def party(self, name: str, weight: float = 1.0) -> Party:
        """The handle of model ``name`` (made on first use; ``weight`` updated)."""
        if weight <= 0:
            raise ValueError(f"a CPU share must be above 0, not {weight}")
        with self._lock:
            party = self._parties.get(name)
            if party is None:
                party = self._parties[name] = Party(self, name, weight)
            party.weight = weight
            return party

    def granted(self) -> int | None:
        """The threads the calling thread holds now (None: it holds none)."""
        return getattr(self._local, "granted", None)

    @property
    def lent(self) -> int:
        return self._lent

    def _share(self, party: Party, now: float) -> int:
        busy = [
            other
            for other in self._parties.values()
            if other is party
            or other.holding
            or other.waiting
            or now - other.last_release < RECENT_S
        ]
        total = sum(other.weight for other in busy)
        # A model's share is split among its own computations (its instances) too.
        computations = max(1, party.running + party.waiting)
        return max(1, int(self.count * party.weight / total / computations))

    @contextmanager
    def take(self, party: Party, wanted: int, at_least: int = 1) -> Iterator[int]:
        held = self.granted()
        if held is not None:  # nested: the outer computation's threads
            yield held
            return
        count = self.count
        at_least = max(1, min(at_least, count))
        ticket = object()
        with self._lock:
            party.waiting += 1
            self._queue.append(ticket)
            try:
                told = False
                patience = time.monotonic() + PATIENCE_S
                while True:
                    free = count - self._lent
                    if self._queue[0] is ticket and free >= at_least:
                        share = self._share(party, self._clock())
                        granted = max(at_least, min(wanted, free, share))
                        break
                    left = patience - time.monotonic()
                    if left <= 0:  # waited too long behind a stuck computation: run beside it
                        granted = at_least
                        break
                    if not told and self.on_wait is not None:
                        self.on_wait(party.name)
                        told = True
                    self._lock.wait(left)
            finally:
                self._queue.remove(ticket)
                party.waiting -= 1
                self._lock.notify_all()  # the next in line may go now
            self._lent += granted
            party.holding += granted
            party.running += 1
        self._local.granted = granted
        try:
            self.on_grant(granted)
            yield granted
        finally:
            self._local.granted = None
            with self._lock:
                self._lent -= granted
                party.holding -= granted
                party.running -= 1
                party.last_release = self._clock()
                self._lock.notify_all()


#: This process's cores, shared by every model's thread instances.
CORES = Cores()
