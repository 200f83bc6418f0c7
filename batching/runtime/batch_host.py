"""Where a generating instance's running batch lives and computes: what the decode loop
(:mod:`.scheduler`) asks of it, and the host on the instance's own thread.

The scheduler decides (who joins, who leaves, when a run of steps must stop); a host does:
it opens the running batch, prefills a turn's newcomers, and runs decode steps until the
scheduler has something to decide. :class:`ThreadHost` does it on a thread instance's thread,
in the server's process; :mod:`.process_host` does it in a process of its own, where the
steps do not share the interpreter (and its lock) with the event loop that writes the
streams.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from batching.models.generation.pieces import Joining, Piece

from .step_run import StepRun, Watched

__all__ = ["BatchHost", "CallModel", "Post", "RunningBatch", "ThreadHost", "open_batch"]

logger = logging.getLogger("batching")

T = TypeVar("T")

#: Hands one step's pieces and its seconds to the event loop, in order (thread-safe).
Post = Callable[[list[Piece], float], None]


class CallModel(Protocol):
    """Runs a function of the instance's loaded model on the instance's own thread."""

    def __call__(self, function: Callable[[object], T], /) -> Awaitable[T]: ...


class RunningBatch(Protocol):
    """The model side of the loop (:class:`batching.models.generation.running.RunningBatchBase`)."""

    def __len__(self) -> int: ...

    def join_items(self, items: Sequence[Joining]) -> list[Piece | BaseException]:
        """The newcomers of one turn prefilled together: each its first piece, or the
        exception that fails it alone, in their order."""
        ...

    def step(self) -> list[Piece]: ...

    def leave(self, keys: set[int]) -> None: ...


@runtime_checkable
class GeneratingModel(Protocol):
    """What the loop needs of a loaded generating model: its running batch, and how many
    positions a sequence may take (its context)."""

    def decode_batch(self) -> RunningBatch: ...

    def positions(self) -> int: ...


def open_batch(model: object) -> tuple[RunningBatch, int]:
    """The loaded ``model``'s running batch and its positions (where the model lives)."""
    if not isinstance(model, GeneratingModel):
        raise TypeError(f"a {type(model).__name__} model has no running batch to decode in")
    return model.decode_batch(), model.positions()


def join_turn(
    batch: RunningBatch, leaving: set[int], items: Sequence[Joining], name: str
) -> list[Piece | BaseException]:
    """Drop ``leaving``, prefill ``items`` together, and drop those that ended at their first
    token: each newcomer's first piece, or what failed it."""
    batch.leave(leaving)
    try:
        joined = batch.join_items(items)
    except Exception as exc:  # the batch's own fault: its newcomers fail
        logger.exception("model %s: a prefill failed", name)
        return [exc] * len(items)
    batch.leave(
        {p.key for p in joined if not isinstance(p, BaseException) and p.finish is not None}
    )
    return joined


class BatchHost(Protocol):
    """Where one instance's running batch lives (the scheduler calls one at a time)."""

    async def open(self) -> tuple[object, int]:
        """Open the running batch: what the model's prefix metrics track of it (a
        :class:`~batching.models.generation.prefix_cache.KeepsPrefixes` or anything else),
        and the positions a sequence may take."""
        ...

    async def join(
        self, leaving: set[int], items: Sequence[Joining]
    ) -> list[Piece | BaseException]:
        """:func:`join_turn` where the batch lives."""
        ...

    async def run(
        self,
        leaving: set[int],
        stepping: Sequence[tuple[int, Watched]],
        waiting: Callable[[], bool],
        now: Callable[[], float],
        post: Post,
    ) -> BaseException | None:
        """Drop ``leaving``, then decode steps of the running rows until a newcomer waits
        (``waiting``), a stream of ``stepping`` was cancelled or passed its deadline (on
        ``now``'s clock), or the run's bounds (:mod:`.step_run`); each step's pieces go to
        ``post`` as it ends. The exception that failed a step (its rows have left), or None."""
        ...


class ThreadHost:
    """The running batch on a thread instance's thread (``call`` runs a function of the
    loaded model there)."""

    def __init__(self, call: CallModel, name: str = "") -> None:
        self._call = call
        self._name = name
        self._batch: RunningBatch | None = None

    async def open(self) -> tuple[object, int]:
        batch, positions = await self._call(open_batch)
        self._batch = batch
        return batch, positions

    def _opened(self) -> RunningBatch:
        if self._batch is None:
            raise RuntimeError("the running batch is not open")
        return self._batch

    async def join(
        self, leaving: set[int], items: Sequence[Joining]
    ) -> list[Piece | BaseException]:
        batch = self._opened()
        return await self._call(lambda _: join_turn(batch, leaving, items, self._name))

    async def run(
        self,
        leaving: set[int],
        stepping: Sequence[tuple[int, Watched]],
        waiting: Callable[[], bool],
        now: Callable[[], float],
        post: Post,
    ) -> BaseException | None:
        batch = self._opened()
        return await self._call(StepRun(batch, leaving, stepping, waiting, now, post))
