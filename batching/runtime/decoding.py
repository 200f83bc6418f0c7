"""The iteration-level scheduler of a text-generation model: a second scheduler beside the
batcher, for requests that generate token by token (the streaming doors).

Each instance runs a loop of decode steps on its own thread (the batcher's whole batches
take the same thread between steps). Before every step, the ones whose client went away or
whose deadline passed leave, and waiting requests join the running batch: their prefill runs
first, all of a turn's newcomers together when the batch offers ``join_items``, and their
first tokens go out while the step runs (a newcomer does not wait for the running rows'
step before its first token). After the step, finished ones leave at once, freeing their
rows of the cache. A request's tokens reach it as they come (:class:`Stream`).

Admission counts tokens: a request reserves its prompt's tokens plus its ``max_new_tokens``
(the most cache it can fill) from the model's budget (``--max-batch-tokens``; by default
``max_batch_size`` sequences of the model's full length) until it ends. A request that would
overdraw the budget is refused at once, 503 with Retry-After; one larger than the whole
budget can never run, a 413. At most ``max_batch_size`` sequences run on an instance at once;
more wait their turn (they hold their reservation).

Faults stay per sequence: a prompt that cannot be prepared (too long with ``truncate: false``,
not a text) or whose prefill raises fails that request only. A step raises only for what the
whole batch shares (the model itself): it fails the sequences of that batch, and the loop
goes on with a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from batching.errors import (
    BatchingError,
    DeadlineExceeded,
    InferenceFailed,
    InvalidRequest,
    NotReady,
    Overloaded,
    PayloadTooLarge,
)

__all__ = ["Decoder", "Piece", "RunningBatch", "Stream"]

logger = logging.getLogger("batching")

T = TypeVar("T")

#: Runs a function of the instance's loaded model on the instance's own thread.
CallModel = Callable[[Callable[[Any], T]], Awaitable[T]]


class Piece(Protocol):
    """What a step hands a sequence (:class:`batching.models.decoding.Token`)."""

    key: int
    token_id: int
    text: str
    finish: str | None
    prompt_tokens: int


class RunningBatch(Protocol):
    """The model side of the loop (:class:`batching.models.decoding.DecodeBatch`).

    A batch may also offer ``join_items(items: Sequence[tuple[int, Any]]) ->
    list[Piece | BaseException]``: the newcomers of one turn (key and item) prefilled
    together, each with its first piece or the exception that fails it alone, in their order.
    The loop uses it when it is there, and ``join_item`` one by one otherwise.
    """

    def __len__(self) -> int: ...
    def join_item(self, key: int, item: Any) -> Piece: ...
    def step(self) -> list[Piece]: ...
    def leave(self, keys: set[int]) -> None: ...


#: Yielded once a stream ends: nothing more comes.
_END = object()


@dataclass(eq=False)
class Stream:
    """One request's sequence as its door sees it: pieces of text as they are generated."""

    key: int
    item: Any
    tokens: int
    deadline: float
    request_id: str = ""
    #: Tokens generated so far.
    generated: int = 0
    finish: str | None = None
    cancelled: bool = False
    _queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)

    def cancel(self) -> None:
        """The client went away: the sequence leaves the batch at the next step."""
        self.cancelled = True

    async def next(self) -> Piece | None:
        """The next piece (None: the stream ended), waiting no later than the deadline.

        :raises DeadlineExceeded: the deadline passed first.
        :raises BatchingError: the sequence failed (its own error: 413, 422, 500, 503).
        """
        try:
            async with asyncio.timeout_at(self.deadline):
                value = await self._queue.get()
        except TimeoutError:
            self.cancel()
            raise DeadlineExceeded("the deadline passed while the answer was generated") from None
        if value is _END:
            self._queue.put_nowait(_END)
            return None
        if isinstance(value, BaseException):
            raise value
        return value  # type: ignore[no-any-return]

    def _put(self, value: Any) -> None:
        self._queue.put_nowait(value)


class Decoder:
    """One text-generation model's iteration-level scheduler.

    :param name: the model's name (for errors and logs).
    :param max_rows: the most sequences an instance runs at once (``max_batch_size``).
    :param budget: the tokens all accepted requests may reserve; None: ``max_rows`` times
        the model's positions, learnt from the first instance.
    """

    def __init__(
        self,
        name: str,
        max_rows: int,
        budget: int | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        self.max_rows = max(1, max_rows)
        self.budget = budget
        self.reserved = 0
        #: Accepted sequences not finished (running or waiting).
        self.active = 0
        self.instances = 0
        self.draining = False
        #: Why this model cannot decode by step (its cache kind), once an instance said so.
        self.unsupported: str | None = None
        self._clock = clock
        self._keys = itertools.count()
        self._waiting: deque[Stream] = deque()
        self._work = asyncio.Event()
        #: Seconds a step took lately, for the Retry-After of a full budget.
        self._step_s = 0.05

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return asyncio.get_running_loop().time()

    # -- admission --------------------------------------------------------------------------

    def admit(self) -> int:
        """Refuse now what :meth:`submit` would refuse whatever the request's tokens: a door
        asks before it counts them. Returns the token budget.

        :raises InvalidRequest: the model's cache cannot join a running batch.
        :raises NotReady: no instance is serving (loading, or shutting down).
        """
        if self.unsupported is not None:
            raise InvalidRequest(f"model {self.name!r} cannot stream: {self.unsupported}")
        if self.draining or self.instances == 0 or self.budget is None:
            raise NotReady(f"model {self.name!r} is not ready", retry_after=1.0)
        return self.budget

    def submit(self, item: Any, tokens: int, deadline: float, request_id: str = "") -> Stream:
        """Accept ``item`` (it costs ``tokens``: prompt and ``max_new_tokens``) or refuse it.

        :raises InvalidRequest: the model's cache cannot join a running batch.
        :raises NotReady: no instance is serving (loading, or shutting down).
        :raises PayloadTooLarge: more tokens than the whole budget.
        :raises Overloaded: the budget is full now.
        """
        budget = self.admit()
        if tokens > budget:
            raise PayloadTooLarge(
                f"this request needs {tokens} tokens (prompt and max_new_tokens); model "
                f"{self.name!r} holds at most {budget} (--max-batch-tokens)"
            )
        if self.reserved + tokens > budget:
            raise Overloaded(
                f"model {self.name!r} is generating as many tokens as it holds; retry shortly",
                retry_after=max(1.0, self._step_s * 32),
            )
        self.reserved += tokens
        self.active += 1
        stream = Stream(next(self._keys), item, tokens, deadline, request_id)
        self._waiting.append(stream)
        self._work.set()
        return stream

    def _release(self, stream: Stream, value: Any) -> None:
        if stream.finish is None:
            stream.finish = "error" if isinstance(value, BaseException) else "done"
            self.reserved -= stream.tokens
            self.active -= 1
        stream._put(value)
        if not isinstance(value, BaseException):
            stream._put(_END)

    # -- the loop ---------------------------------------------------------------------------

    async def serve(self, call: Callable[[Callable[[Any], Any]], Awaitable[Any]]) -> None:
        """Run decode steps on one instance (``call`` runs a function of its model on its
        thread) until cancelled."""
        batch: RunningBatch
        try:
            batch, positions = await call(lambda model: (model.decode_batch(), model.positions()))
        except NotImplementedError as exc:
            self.unsupported = str(exc)
            logger.warning("model %s serves whole batches only: %s", self.name, exc)
            return
        if self.budget is None:
            self.budget = self.max_rows * int(positions)
        running: dict[int, Stream] = {}
        self.instances += 1
        try:
            while True:
                if not running and not self._waiting:
                    self._work.clear()
                    await self._work.wait()
                await self._step(call, batch, running)
        finally:
            self.instances -= 1
            for stream in running.values():
                self._release(stream, NotReady("the instance stopped before this answer ended"))
            if self.instances == 0:
                while self._waiting:
                    self._release(
                        self._waiting.popleft(),
                        NotReady("the server shut down before serving this request"),
                    )

    async def _step(
        self,
        call: Callable[[Callable[[Any], Any]], Awaitable[Any]],
        batch: RunningBatch,
        running: dict[int, Stream],
    ) -> None:
        now = self._now()
        leaving: set[int] = set()
        for key, stream in list(running.items()):
            if stream.cancelled or stream.deadline <= now:
                leaving.add(key)
                self._expire(stream)
                del running[key]
        joining: list[Stream] = []
        while self._waiting and len(running) + len(joining) < self.max_rows:
            stream = self._waiting.popleft()
            if stream.cancelled or stream.deadline <= now:
                self._expire(stream)
                continue
            joining.append(stream)
        if joining:
            await self._join(call, batch, running, leaving, joining)
            leaving = set()
        if running or leaving:
            await self._advance(call, batch, running, leaving)

    async def _join(
        self,
        call: Callable[[Callable[[Any], Any]], Awaitable[Any]],
        batch: RunningBatch,
        running: dict[int, Stream],
        leaving: set[int],
        joining: list[Stream],
    ) -> None:
        """The newcomers' prefill, before the running rows' next step: their first tokens go
        out without waiting for it."""
        items = [(stream.key, stream.item) for stream in joining]
        join_items = getattr(batch, "join_items", None)

        def work(model: Any) -> list[Piece | BaseException]:
            batch.leave(leaving)
            joined: list[Piece | BaseException] = []
            if join_items is not None:
                try:
                    joined = list(join_items(items))
                except Exception:  # the batch's own fault: each newcomer is tried alone
                    logger.exception("model %s: a shared prefill failed", self.name)
                    joined = []
            if len(joined) != len(items):
                joined = []
                for key, item in items:
                    try:
                        joined.append(batch.join_item(key, item))
                    except Exception as exc:
                        joined.append(exc)
            batch.leave({p.key for p in joined if not isinstance(p, BaseException) and p.finish})
            return joined

        joined = await call(work)
        for stream, outcome in zip(joining, joined, strict=True):
            if isinstance(outcome, BaseException):
                self._release(stream, self._failure(stream, outcome))
                continue
            running[stream.key] = stream
            self._deliver(running, stream, outcome)

    async def _advance(
        self,
        call: Callable[[Callable[[Any], Any]], Awaitable[Any]],
        batch: RunningBatch,
        running: dict[int, Stream],
        leaving: set[int],
    ) -> None:
        """One step of the running rows; the ones it finished leave at once."""
        stepping = list(running)

        def work(model: Any) -> list[Piece] | BaseException:
            batch.leave(leaving)
            if not len(batch):
                return []
            try:
                stepped = batch.step()
            except Exception as exc:
                batch.leave(set(stepping))
                return exc
            batch.leave({piece.key for piece in stepped if piece.finish})
            return stepped

        started = time.perf_counter()
        stepped = await call(work)
        self._step_s = 0.8 * self._step_s + 0.2 * (time.perf_counter() - started)
        if isinstance(stepped, BaseException):
            logger.error("model %s: a decode step failed", self.name, exc_info=stepped)
            for key in stepping:
                self._release(running.pop(key), InferenceFailed("the model failed on this batch"))
        else:
            for piece in stepped:
                self._deliver(running, running[piece.key], piece)

    def _deliver(self, running: dict[int, Stream], stream: Stream, piece: Piece) -> None:
        stream.generated += 1
        if not stream.cancelled:
            stream._put(piece)
        if piece.finish is not None:
            running.pop(stream.key, None)
            self._release(stream, _END)

    def _expire(self, stream: Stream) -> None:
        if stream.cancelled:
            self._release(stream, NotReady("the client went away"))
        else:
            self._release(stream, DeadlineExceeded("the deadline passed while generating"))

    def _failure(self, stream: Stream, exc: BaseException) -> BaseException:
        if isinstance(exc, BatchingError):
            return exc
        logger.error(
            "request %s: model %s failed on its input",
            stream.request_id or "-",
            self.name,
            exc_info=exc,
        )
        return InferenceFailed("the model failed on this input")

    def drain(self) -> None:
        """Refuse new requests; what runs goes on."""
        self.draining = True

    @property
    def idle(self) -> bool:
        return self.reserved == 0


async def run_decoder(decoder: Decoder, call: CallModel[Any]) -> None:
    """:meth:`Decoder.serve`, logging an unexpected end (the instance goes on serving
    whole batches)."""
    with contextlib.suppress(asyncio.CancelledError):
        try:
            await decoder.serve(call)
        except Exception:
            logger.exception("model %s: the decode loop stopped", decoder.name)
