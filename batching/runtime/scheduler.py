"""The iteration-level scheduler of a generating model (causal or encoder-decoder): every
request to it, whatever its door, runs here, beside the batcher.

Each instance runs a loop of decode steps on its own thread. Before every step, the streams
that finished (cancelled by their door, or past their deadline) leave, and waiting requests
join the running batch: a turn's newcomers are prefilled together, and their first tokens go
out while the step runs (a newcomer does not wait for the running rows' step before its first
token). After the step, finished ones leave at once, freeing their rows of the cache. A
request's pieces reach it as they come (:class:`Stream`); a door that answers the whole text
gathers them.

Admission counts tokens: a request reserves its prompt's tokens plus its ``max_new_tokens``
(the most cache it can fill) from the model's budget (``--max-batch-tokens``; by default
``max_batch_size`` sequences of the model's full length) until its row leaves. A request that
would overdraw the budget is refused at once, 503 with Retry-After; one larger than the whole
budget can never run, a 413. At most ``max_batch_size`` sequences run on an instance at once;
more wait their turn (they hold their reservation).

A stream's life is one value, its :class:`~batching.models.generation.pieces.Status`: waiting,
running, then finished by its length, a stop string or the end token (the running batch says),
or cancelled, or an error (this scheduler says). Faults stay per stream: an item that cannot be
prepared (too long with ``truncate: false``, not a text) or whose prefill raises fails that
stream only (the running batch tries a failed shared prefill one by one). A step raises only
for what the whole batch shares (the model itself): it fails the streams of that batch, and
the loop goes on with a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from batching.core.events import BatchEvents, NoEvents
from batching.core.jobs import InstanceLost
from batching.errors import (
    BatchingError,
    DeadlineExceeded,
    InferenceFailed,
    NotReady,
    Overloaded,
    PayloadTooLarge,
)
from batching.models.generation.pieces import Joining, Piece, Status
from batching.models.generation.prefix_cache import PrefixLedger
from batching.models.items import Item

from .batch_host import BatchHost

__all__ = ["StepScheduler", "Stream", "run_scheduler"]

logger = logging.getLogger("batching")


@dataclass(eq=False)
class Stream:
    """One request item's sequence as its door sees it: pieces of text as they are
    generated, and its :class:`~batching.models.generation.pieces.Status`."""

    key: int
    item: Item
    tokens: int
    deadline: float
    request_id: str = ""
    #: The item's place in its request (an error about it names it: ``inputs[2]``).
    place: int = 0
    status: Status = Status.WAITING
    #: Tokens generated so far.
    generated: int = 0
    #: When it was accepted and when it joined the running batch (the scheduler's clock),
    #: and the seconds of the forwards it ran in.
    submitted: float = 0.0
    joined: float | None = None
    computed: float = 0.0
    _pieces: deque[Piece] = field(default_factory=deque)
    _error: BaseException | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    #: Fails the stream at its deadline: one timer for the whole stream, set by the first
    #: :meth:`next` that waits, not one per piece (a piece's wait is a token's time).
    _timer: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        """The client went away (or its door stopped reading): the row leaves at the next
        step, and what it would still generate is dropped."""
        if not self.status.finished:
            self.status = Status.FINISHED_CANCELLED
            self._arrived.set()
            self._ended()

    async def next(self) -> Piece | None:
        """The next piece (None: the stream ended), waiting no later than the deadline.

        :raises DeadlineExceeded: the deadline passed first.
        :raises BatchingError: the stream failed (its own error: 413, 422, 500, 503).
        """
        if not self._pieces and not self.status.finished:
            if self._timer is None and math.isfinite(self.deadline):
                loop = asyncio.get_running_loop()
                self._timer = loop.call_at(self.deadline, self._expired)
            while not self._pieces and not self.status.finished:
                self._arrived.clear()
                await self._arrived.wait()
        if self._pieces:
            return self._pieces.popleft()
        if self._error is not None:
            raise self._error
        return None

    def _expired(self) -> None:
        self._timer = None
        self._fail(DeadlineExceeded("the deadline passed while the answer was generated"))

    def _put(self, piece: Piece) -> None:
        if self.status.finished:
            return  # cancelled: nobody reads it
        self._pieces.append(piece)
        self.status = piece.finish or Status.RUNNING
        self._arrived.set()
        if piece.finish is not None:
            self._ended()

    def _fail(self, error: BaseException) -> None:
        if self.status.finished:
            return
        self.status, self._error = Status.FINISHED_ERROR, error
        self._arrived.set()
        self._ended()

    def _ended(self) -> None:
        """The stream finished: its deadline's timer goes (an ended stream keeps nothing on
        the event loop)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class StepScheduler:
    """One generating model's iteration-level scheduler.

    :param name: the model's name (for errors and logs).
    :param max_rows: the most sequences an instance runs at once (``max_batch_size``).
    :param budget: the tokens all accepted requests may reserve; None: ``max_rows`` times
        the model's positions, learnt from the first instance.
    :param events: told of each prefill as a batch (the streams that joined together, each
        item once) and of each stream's end, as the batcher tells of its batches, and of
        each decode step (its rows and seconds).
    """

    def __init__(
        self,
        name: str,
        max_rows: int,
        budget: int | None = None,
        clock: Callable[[], float] | None = None,
        events: BatchEvents | None = None,
    ) -> None:
        self.name = name
        self.events: BatchEvents = events or NoEvents()
        self.max_rows = max(1, max_rows)
        self.budget = budget
        self.instances = 0
        self.draining = False
        self._clock = clock
        self._keys = itertools.count()
        #: Accepted streams whose rows have not left yet: they hold their tokens.
        self._live: dict[int, Stream] = {}
        self._waiting: deque[Stream] = deque()
        self._work = asyncio.Event()
        #: Seconds a step took lately, for the Retry-After of a full budget.
        self._step_s = 0.05
        #: What the instances' running batches keep of their prompts' prefixes (metrics).
        self.prefixes = PrefixLedger()

    @property
    def reserved(self) -> int:
        """The tokens the accepted streams hold."""
        return sum(stream.tokens for stream in self._live.values())

    @property
    def active(self) -> int:
        """Accepted streams whose rows have not left yet (running or waiting)."""
        return len(self._live)

    @property
    def idle(self) -> bool:
        return not self._live

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return asyncio.get_running_loop().time()

    # -- admission --------------------------------------------------------------------------

    def admit(self) -> int:
        """Refuse now what :meth:`submit` would refuse whatever the request's tokens: a door
        asks before it counts them. Returns the token budget.

        :raises NotReady: no instance is serving (loading, or shutting down).
        """
        if self.draining or self.instances == 0 or self.budget is None:
            raise NotReady(f"model {self.name!r} is not ready", retry_after=1.0)
        return self.budget

    def submit(
        self, item: Item, tokens: int, deadline: float, request_id: str = "", place: int = 0
    ) -> Stream:
        """Accept ``item`` (it costs ``tokens``: prompt and ``max_new_tokens``) or refuse it.

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
        stream = Stream(next(self._keys), item, tokens, deadline, request_id, place)
        stream.submitted = self._now()
        self._live[stream.key] = stream
        self._waiting.append(stream)
        self._work.set()
        return stream

    def _fail(self, stream: Stream, error: BaseException) -> None:
        """End ``stream`` with ``error``; its row is out of the batch (or never joined)."""
        stream._fail(error)
        self._left(stream)

    def _left(self, stream: Stream) -> None:
        """``stream``'s row is out of the batch (or never joined): its tokens are free."""
        if self._live.pop(stream.key, None) is None:
            return
        now = self._now()
        joined = now if stream.joined is None else stream.joined
        ok = stream.status in (Status.FINISHED_LENGTH, Status.FINISHED_STOP, Status.FINISHED_END)
        self.events.request_done(
            joined - stream.submitted, stream.computed, now - stream.submitted, ok
        )

    # -- the loop ---------------------------------------------------------------------------

    async def serve(self, host: BatchHost, opened: asyncio.Event | None = None) -> None:
        """Run decode steps on one instance (``host``: where its running batch lives) until
        cancelled; ``opened`` is set once its running batch is open and it takes streams."""
        batch, positions = await host.open()
        if self.budget is None:
            self.budget = self.max_rows * int(positions)
        running: dict[int, Stream] = {}
        self.instances += 1
        self.prefixes.track(batch)
        if opened is not None:
            opened.set()
        try:
            while True:
                if not running and not self._waiting:
                    self._work.clear()
                    await self._work.wait()
                await self._step(host, running)
        finally:
            self.instances -= 1
            self.prefixes.retire(batch)
            for stream in running.values():
                self._fail(stream, NotReady("the instance stopped before this answer ended"))
            if self.instances == 0:
                while self._waiting:
                    self._fail(
                        self._waiting.popleft(),
                        NotReady("the server shut down before serving this request"),
                    )

    def _share(self) -> int:
        """The most rows one instance's batch takes now: ``max_rows``, and with several
        instances their fair share of the accepted streams (running or waiting), so that
        newcomers arriving together are spread over the instances' batches instead of filling
        the first one to step while the others idle."""
        if self.instances <= 1:
            return self.max_rows
        return min(self.max_rows, -(-self.active // self.instances))

    async def _step(self, host: BatchHost, running: dict[int, Stream]) -> None:
        now = self._now()
        leaving: set[int] = set()
        for key, stream in list(running.items()):
            if stream.status.finished or stream.deadline <= now:
                leaving.add(key)
                del running[key]
                self._expire(stream)
        joining: list[Stream] = []
        share = self._share()
        while self._waiting and len(running) + len(joining) < share:
            stream = self._waiting.popleft()
            if stream.status.finished or stream.deadline <= now:
                self._expire(stream)
                continue
            joining.append(stream)
        if joining:
            await self._join(host, running, leaving, joining)
            leaving = set()
        if running or leaving:
            await self._advance(host, running, leaving)

    async def _join(
        self,
        host: BatchHost,
        running: dict[int, Stream],
        leaving: set[int],
        joining: list[Stream],
    ) -> None:
        """The newcomers' prefill, before the running rows' next step: their first tokens go
        out without waiting for it."""
        items = [Joining(stream.key, stream.item, stream.place) for stream in joining]

        started, now = time.perf_counter(), self._now()
        joined = await host.join(leaving, items)
        seconds = time.perf_counter() - started
        pieces = [piece for piece in joined if not isinstance(piece, BaseException)]
        if pieces:
            self.events.batch_done(
                len(pieces),
                len(pieces) * max(piece.prompt_tokens for piece in pieces),
                "prefill",
                now - min(stream.submitted for stream in joining),
                seconds,
            )
        for stream, outcome in zip(joining, joined, strict=True):
            if isinstance(outcome, BaseException):
                self._fail(stream, self._failure(stream, outcome))
                continue
            stream.joined, stream.computed = now, seconds
            running[stream.key] = stream
            self._deliver(running, stream, outcome)

    async def _advance(
        self,
        host: BatchHost,
        running: dict[int, Stream],
        leaving: set[int],
    ) -> None:
        """Steps of the running rows on the instance's thread, until a newcomer waits or a
        stream ends otherwise than by its rows (:mod:`.step_run`); each step's pieces are
        delivered as it ends, and the rows it finished leave at once."""
        stepping = list(running.items())
        loop = asyncio.get_running_loop()

        def post(pieces: list[Piece], seconds: float) -> None:
            loop.call_soon_threadsafe(self._stepped, running, stepping, pieces, seconds)

        failed = await host.run(
            leaving,
            stepping,
            lambda: bool(self._waiting) and len(running) < self.max_rows,
            self._clock or loop.time,
            post,
        )
        if failed is not None:
            logger.error("model %s: a decode step failed", self.name, exc_info=failed)
            for key, _ in stepping:
                if key in running:
                    self._fail(running.pop(key), InferenceFailed("the model failed on this batch"))

    def _stepped(
        self,
        running: dict[int, Stream],
        stepping: list[tuple[int, Stream]],
        pieces: list[Piece],
        seconds: float,
    ) -> None:
        """One step of a run ended (on the event loop, in the steps' order)."""
        self._step_s = 0.8 * self._step_s + 0.2 * seconds
        self.events.step_done(len(pieces), seconds)
        for _, each in stepping:
            each.computed += seconds
        for piece in pieces:
            stream = running.get(piece.key)
            if stream is not None:  # not ended by the loop meanwhile
                self._deliver(running, stream, piece)

    def _deliver(self, running: dict[int, Stream], stream: Stream, piece: Piece) -> None:
        stream.generated += 1
        stream._put(piece)
        if piece.finish is not None:
            running.pop(stream.key, None)
            self._left(stream)

    def _expire(self, stream: Stream) -> None:
        """``stream`` leaves (or never joins): cancelled by its door, failed, or past its
        deadline."""
        self._fail(stream, DeadlineExceeded("the deadline passed while generating"))

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


async def run_scheduler(
    scheduler: StepScheduler, host: BatchHost, opened: asyncio.Event | None = None
) -> None:
    """:meth:`StepScheduler.serve`, logging an unexpected end."""
    with contextlib.suppress(asyncio.CancelledError):
        try:
            await scheduler.serve(host, opened)
        except InstanceLost as exc:  # the deployment says so, and restarts the instance
            logger.error("model %s: the decode loop lost its instance (%s)", scheduler.name, exc)
        except Exception:
            logger.exception("model %s: the decode loop stopped", scheduler.name)
