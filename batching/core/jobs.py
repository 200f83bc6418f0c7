"""What travels through a model's queue: a caller's request and the slices of it (jobs) that
batches carry, and the callable that runs a batch on an instance.

The core is generic in the item type (``ItemT``): it only counts items, slices them and hands
them to the instance's runner, so it never needs to know what they are; the runtime binds it
to the models' :data:`~batching.models.items.Item`. Outputs are ``object`` here: the core
stores them and hands each caller its own, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

__all__ = ["InstanceLost", "ItemT", "Job", "Outputs", "Pending", "Submission", "RunBatch"]

#: The type of the items a batcher carries (the runtime's: the models' ``Item``).
ItemT = TypeVar("ItemT")


class Outputs(Protocol):
    """A batch's outputs, one per input, in order: a sequence, or an array whose first axis
    is the inputs (a numpy array fits without the core importing numpy). The batcher only
    counts them and hands out slices."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[object]: ...

    def __getitem__(self, index: slice, /) -> Outputs: ...


#: Runs one batch on an instance: inputs in, one output per input out, plus seconds computed.
RunBatch = Callable[[list[ItemT]], Awaitable[tuple[Outputs, float]]]


class Pending(asyncio.Future[list[object]]):
    """The future of one submitted request's outputs, as :meth:`Batcher.submit` returns it.

    :attr:`running` says whether a batch has started on any of its items, so that a caller
    whose deadline passes can tell whether it expired in the queue or while it ran.
    """

    running: bool = False


@dataclass(eq=False, slots=True)
class Submission(Generic[ItemT]):
    """One caller's submission: its items, their results so far, and the future to resolve."""

    items: list[ItemT]
    tokens: list[int] | None
    future: Pending
    enqueued_at: float
    deadline: float
    request_id: str = ""
    results: list[object] = field(default_factory=list)
    unresolved: int = 0
    #: When it was admitted and when its first batch started (None while no part of it has
    #: run), both on the batcher's statistics clock, not the loop's.
    admitted: float = 0.0
    started: float | None = None
    #: Seconds of model compute of the batches it ran in.
    compute_s: float = 0.0
    #: Whether the batcher has reported how it was resolved (``request_done``).
    reported: bool = False
    #: A cap on the padded tokens (items x longest) of every batch its items run in, under
    #: the model's own token cap; None: the model's cap alone. Needs ``tokens``.
    token_cap: int | None = None
    #: The caller's trace context, opaque to the core (None: not traced); handed back in
    #: :class:`~batching.core.events.BatchRun` and :meth:`BatchEvents.request_ran`.
    trace: object | None = None
    #: Batches it ran in (traced requests only).
    batches: int = 0

    def settle(self, start: int, outputs: Outputs) -> None:
        """Store the outputs of items ``start...``; resolve the future once all are in."""
        if self.future.done():
            return
        stop = start + len(outputs)
        self.results[start:stop] = outputs
        self.unresolved -= stop - start
        if self.unresolved == 0:
            self.future.set_result(self.results)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


@dataclass(eq=False, slots=True)
class Job(Generic[ItemT]):
    """A queue entry: the slice ``[start, stop)`` of one request's items."""

    request: Submission[ItemT]
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


class InstanceLost(Exception):
    """Raised by an instance's runner when the instance itself died, not the model's input."""
