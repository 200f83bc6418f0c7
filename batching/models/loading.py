"""One model loads at a time, process-wide, in the order the loads were asked for.

The libraries a model loads through import their parts lazily on first use, and those imports
are not safe to run side by side: transformers' lazy module, asked for ``AutoModel`` on one
thread while another thread is importing ``transformers.pipelines``, can hand back a module
that is still half initialised (``module 'transformers' has no attribute 'AutoModel'``), and
tokenizers, ONNX Runtime and OpenVINO build process-wide state on first use too. A repository
of several models loads each on its own instance thread, so without an order the start fails
or not by timing alone.

:data:`LOADING` orders them. Whatever builds or loads a model (its object, its tokenizer for
counting, its ``load``, its warm-up batches, an engine measured again and swapped in) waits
for its **turn**; turns are given in the order they were taken, so the models of a repository
load in the repository's order (each deployment takes its turn on the event loop before it
hands the load to its thread). Serving never waits: batches of models already loaded run
beside a load. Loading one after another costs little: the loads are CPU-bound, and an engine
timed while another model loads on the same cores would be timed wrong anyway.

A load that holds its turn for longer than :data:`PATIENCE_S` is taken to be stuck (a load
that never returns, a lock that is never released): the next turns go ahead beside it, with a
warning, rather than wait behind it for good.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["LOADING", "PATIENCE_S", "Loading", "Turn"]

logger = logging.getLogger("batching")

#: How long one load may hold its turn before the next goes ahead beside it, in seconds.
PATIENCE_S = 300.0


class Turn:
    """A place in line for loading: :meth:`wait` until it comes, :meth:`done` when the load
    is over (whatever became of it)."""

    def __init__(self, line: Loading, what: str) -> None:
        self._line = line
        self.what = what

    def wait(self) -> bool:
        """Block until this turn comes (every earlier turn is done, or the one loading has
        held its turn past the patience): True; False if it was given up meanwhile."""
        return self._line._wait(self)

    def done(self) -> None:
        """The load is over, or given up before its turn came (a waiter then returns
        False)."""
        self._line._done(self)


class Loading:
    """Turns to load, first come first served.

    :param patience_s: how long a load may hold its turn before the next goes beside it.
    """

    def __init__(self, patience_s: float = PATIENCE_S) -> None:
        self.patience_s = patience_s
        self._changed = threading.Condition()
        self._line: deque[Turn] = deque()
        self._holding: dict[Turn, float] = {}
        self._local = threading.local()

    def take(self, what: str) -> Turn:
        """A turn at the back of the line (does not wait). ``what`` names the load in logs."""
        turn = Turn(self, what)
        with self._changed:
            self._line.append(turn)
        return turn

    def _wait(self, turn: Turn) -> bool:
        with self._changed:
            while True:
                if turn not in self._line:
                    return False  # given up (its load was cancelled) while it waited
                if self._line[0] is turn and not self._holding:
                    break
                stuck = [
                    other
                    for other, since in self._holding.items()
                    if time.monotonic() - since > self.patience_s
                ]
                if self._line[0] is turn and len(stuck) == len(self._holding):
                    logger.warning(
                        "loading %s beside %s, whose load has not finished in %.0f s",
                        turn.what,
                        ", ".join(other.what for other in stuck),
                        self.patience_s,
                    )
                    break
                self._changed.wait(self._next_check())
            self._line.popleft()
            self._holding[turn] = time.monotonic()
            self._changed.notify_all()
            return True

    def _next_check(self) -> float | None:
        if not self._holding:
            return None
        oldest = min(self._holding.values())
        return max(0.01, oldest + self.patience_s - time.monotonic())

    def _done(self, turn: Turn) -> None:
        with self._changed:
            if turn in self._line:
                self._line.remove(turn)
            self._holding.pop(turn, None)
            self._changed.notify_all()

    @contextmanager
    def turn(self, what: str) -> Iterator[None]:
        """Take a turn, wait for it and hold it for the block (on this thread). Reentrant: a
        block on a thread that already holds a turn runs at once."""
        if getattr(self._local, "held", 0):
            self._local.held += 1
            try:
                yield
            finally:
                self._local.held -= 1
            return
        turn = self.take(what)
        try:
            turn.wait()
            self._local.held = 1
            yield
        finally:
            self._local.held = 0
            turn.done()


#: The process's line of loads.
LOADING = Loading()
