"""A run of decode steps on an instance's thread: the running rows step again and again
without a round trip through the event loop between two steps, for as long as nothing the
event loop decides has changed.

Stepping once per call made every step wait for the event loop: the step's pieces went back,
the loop delivered them and only then handed the next step to the thread, while the loop was
also writing the streams' chunks. Measured on two cores with 16 streams, the thread stood idle
between two steps for about a fifth of the time (``docs/generation.md``, "Where a decode step's
time goes"). A run steps on while:

- no newcomer waits for a free row (the loop joins newcomers: their prefill comes first);
- no running stream was cancelled by its door or passed its deadline (the loop ends them);
- the run is shorter than :data:`MAX_STEPS` steps and :data:`MAX_SECONDS` (the instance's
  thread takes other calls too, and the loop's bookkeeping stays fresh).

Each step's pieces are posted to the event loop as soon as the step ends (``post``: a
thread-safe hand-off, in order), so a stream's tokens go out as they come; rows that finished
leave the batch on the thread at once. The loop is the only writer of the streams and of the
scheduler's state: the run only reads them (a stream's status and deadline, whether newcomers
wait), which it may do from the thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from batching.models.generation.pieces import Piece, Status

__all__ = ["MAX_SECONDS", "MAX_STEPS", "StepRun", "Watched"]

#: The most steps one run takes before it hands back to the event loop.
MAX_STEPS = 256
#: The longest one run lasts, in seconds, before it hands back to the event loop.
MAX_SECONDS = 0.25


class Batch(Protocol):
    def __len__(self) -> int: ...

    def step(self) -> list[Piece]: ...

    def leave(self, keys: set[int]) -> None: ...


class Watched(Protocol):
    """What the run reads of a running stream (the loop writes it)."""

    deadline: float
    status: Status


@dataclass(slots=True)
class StepRun:
    """Steps of ``batch`` on the instance's thread (call it with the loaded model).

    :param batch: the instance's running batch.
    :param leaving: rows to drop before the first step.
    :param streams: the running streams when the run began, by key.
    :param waiting: whether a newcomer waits for a free row (read from the thread).
    :param now: the scheduler's clock (its deadlines' time).
    :param post: hands one step's pieces and its seconds to the event loop, in order.
    """

    batch: Batch
    leaving: set[int]
    streams: Sequence[tuple[int, Watched]]
    waiting: Callable[[], bool]
    now: Callable[[], float]
    post: Callable[[list[Piece], float], None]
    max_steps: int = MAX_STEPS
    max_seconds: float = MAX_SECONDS

    def __call__(self, model: object) -> BaseException | None:
        """Step until something the loop decides changed; the exception that failed a step
        (its rows have left), or None."""
        batch = self.batch
        batch.leave(self.leaving)
        started = time.perf_counter()
        gone: set[int] = set()
        for _ in range(self.max_steps):
            if not len(batch):
                return None
            before = time.perf_counter()
            try:
                stepped = batch.step()
            except Exception as exc:
                batch.leave({key for key, _ in self.streams})
                return exc
            finished = {piece.key for piece in stepped if piece.finish is not None}
            batch.leave(finished)
            gone |= finished
            after = time.perf_counter()
            try:
                self.post(stepped, after - before)
            except RuntimeError:  # the event loop closed (shutting down): nobody reads on
                return None
            if after - started >= self.max_seconds or self._changed(gone):
                return None
        return None

    def _changed(self, gone: set[int]) -> bool:
        """Whether the loop has something to decide: a newcomer waits, or a running stream
        was cancelled or passed its deadline."""
        if self.waiting():
            return True
        now = self.now()
        return any(
            key not in gone and (stream.status.finished or stream.deadline <= now)
            for key, stream in self.streams
        )
