"""Generation through a model's decode loop (:mod:`batching.runtime.scheduler`), for every door
that generates: each item is a stream of pieces; a door that answers the whole text gathers
them (:func:`complete`), a streaming door reads them as they come (:func:`open_stream`).

Both resolve each item's cost in tokens (prompt and ``max_new_tokens``, the model's own
tokenizer) after the checks that refuse a request whatever its tokens, submit it to the
model's scheduler and wait for its first piece, so that every refusal and every failure
before the first token (413, 422, 503, 504) is an ordinary error answer, before a door has
sent a byte; each refusal is counted once per request. The deadline (the model's
``--timeout-ms``, lowered by the client's) bounds both the first token and the whole answer.
A client that goes away stops its streams at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from batching.errors import (
    BatchingError,
    ClientGone,
    DeadlineExceeded,
    InvalidRequest,
    NotReady,
    Overloaded,
    PayloadTooLarge,
)
from batching.models.generation.pieces import Answer, Piece, Status
from batching.models.generation.token_logprobs import Echo, TokenLogprob
from batching.models.items import Item
from batching.models.parameters import TaskItem
from batching.runtime.scheduler import StepScheduler, Stream

from .calls import Call
from .counting import count_tokens

__all__ = ["Generation", "complete", "open_stream", "open_streams", "refuse_logprobs"]

#: The reason each refusal of a generating request is counted under.
_REASONS: tuple[tuple[type[BatchingError], str], ...] = (
    (DeadlineExceeded, "deadline"),
    (NotReady, "not_ready"),
    (Overloaded, "overloaded"),
    (PayloadTooLarge, "too_large"),
)


@dataclass(eq=False)
class Generation:
    """One item's generation under way: its first piece is already there."""

    call: Call
    stream: Stream
    first: Piece | None
    #: The completion so far (what has been yielded).
    text: str = ""
    prompt_tokens: int = 0
    #: The model's answer to the whole item, once its last piece came.
    answer: Answer | None = None
    #: Each generated token's log-probability so far, when the item asked (``logprobs``).
    logprobs: list[TokenLogprob] = field(default_factory=list)
    #: The prompt echoed, when the item asked (``echo``; on its first piece).
    echo: Echo | None = None
    _counted: bool = field(default=False, repr=False)

    @property
    def status(self) -> Status:
        return self.stream.status

    @property
    def finish_reason(self) -> str | None:
        """Why it ended, as an answer says it (``length``, ``stop``); None before the end."""
        return self.stream.status.finish_reason

    @property
    def completion_tokens(self) -> int:
        return self.stream.generated

    async def parts(self) -> AsyncIterator[tuple[str, bool]]:
        """The text as it is generated, and whether it is the last part (the last one may be
        empty; others are never empty: while a character or a possible stop string is
        incomplete, nothing is yielded).

        :raises DeadlineExceeded: the deadline passed before the answer ended.
        :raises BatchingError: the stream failed.
        """
        piece = self.first
        self.first = None
        try:
            while piece is not None:
                self.prompt_tokens = piece.prompt_tokens or self.prompt_tokens
                self.text += piece.text
                if piece.logprobs is not None:
                    self.logprobs.append(piece.logprobs)
                self.echo = piece.echo or self.echo
                if piece.finish is not None:
                    self.answer = piece.answer
                    yield piece.text, True
                    return
                if piece.text:
                    yield piece.text, False
                piece = await self.stream.next()
        finally:
            self.close()

    async def pieces(self) -> AsyncIterator[str]:
        """The non-empty parts of :meth:`parts`."""
        async for text, _ in self.parts():
            if text:
                yield text

    async def complete(self) -> str:
        """The whole completion."""
        async for _ in self.pieces():
            pass
        return self.text

    def close(self) -> None:
        """The answer ended, or the client went away (or the door stopped reading): leave at
        the next step, and count the tokens generated."""
        self.stream.cancel()
        if not self._counted:
            self._counted = True
            self.call.metrics.child(
                self.call.metrics.generated_tokens, self.call.deployment.name
            ).inc(self.stream.generated)


def _scheduler(call: Call) -> StepScheduler:
    """The deployment's scheduler, admitting a request whatever its tokens.

    :raises InvalidRequest: the model does not generate.
    :raises NotReady: no instance is serving (loading, or shutting down).
    """
    scheduler = call.deployment.scheduler
    if scheduler is None:
        raise InvalidRequest(
            f"model {call.deployment.name!r} does not generate text (a text-generation, "
            "summarization, translation or text2text-generation model does)"
        )
    return scheduler


@contextlib.contextmanager
def _counted(call: Call) -> Iterator[None]:
    """Count a refusal that escapes the block under its reason, once."""
    try:
        yield
    except BatchingError as exc:
        for kind, reason in _REASONS:
            if isinstance(exc, kind):
                call.refused(reason)
                break
        raise


async def _submitted(call: Call, items: Sequence[Item]) -> list[Stream]:
    """``items`` accepted by the model's scheduler, each with its cost in tokens; all or
    none (a refusal cancels the ones submitted before it)."""
    scheduler = _scheduler(call)
    limit = call.deployment.config.batching.max_items_per_request
    if len(items) > limit:
        raise PayloadTooLarge(
            f"a request may carry at most {limit} items, this one has {len(items)}"
        )
    # A stream refused whatever its length costs no counting.
    counts = await count_tokens(
        call.deployment, items, request_id=call.request_id, admit=scheduler.admit
    )
    streams: list[Stream] = []
    try:
        for place, item in enumerate(items):
            tokens = counts.used[place] if counts.used else 1
            streams.append(scheduler.submit(item, tokens, call.deadline, call.request_id, place))
    except BaseException:
        for stream in streams:
            stream.cancel()
        raise
    return streams


async def _first(call: Call, stream: Stream) -> Generation:
    """``stream``'s first piece, timed."""
    started = asyncio.get_running_loop().time()
    try:
        first = await stream.next()
    except BaseException:
        stream.cancel()
        raise
    call.metrics.child(call.metrics.first_token, call.deployment.name).observe(
        asyncio.get_running_loop().time() - started
    )
    return Generation(call, stream, first)


async def open_stream(call: Call, item: Item) -> Generation:
    """Submit ``item`` (a text or a chat, with its parameters) to the model's decode loop and
    wait for its first piece.

    :raises InvalidRequest: the model does not generate.
    :raises PayloadTooLarge: the request needs more tokens than the model holds.
    :raises Overloaded: the model's token budget is full (503, Retry-After).
    :raises DeadlineExceeded: no first token before the deadline.
    """
    with _counted(call):
        (stream,) = await _submitted(call, [item])
        return await _first(call, stream)


def refuse_logprobs(items: Sequence[Item]) -> None:
    """Refuse the ``logprobs`` parameter where the answer has no place for it (the plain
    body, KServe v2 ``infer``): the generate doors answer it.

    :raises InvalidRequest: an item asks for it.
    """
    if any(isinstance(item, TaskItem) and item.get("logprobs") is not None for item in items):
        raise InvalidRequest(
            "parameter 'logprobs' is answered by the generate doors (/v1/completions, "
            "/v1/chat/completions, v2 generate and generate_stream, the gRPC stream), not here"
        )


async def open_streams(call: Call, items: Sequence[Item]) -> list[Generation]:
    """Submit ``items`` together (all or none: ``n`` choices of one request) and wait for
    each one's first piece.

    :raises BatchingError: as :func:`open_stream`; the others are cancelled.
    """
    with _counted(call):
        streams = await _submitted(call, items)
        try:
            return list(await asyncio.gather(*(_first(call, stream) for stream in streams)))
        except BaseException:
            for stream in streams:
                stream.cancel()
            raise


async def complete(call: Call, items: Sequence[Item]) -> list[Generation]:
    """Every item generated to its end, together, in order (each answer gathered from its
    pieces).

    :raises ClientGone: the client went away first (every stream stops at the next step).
    :raises BatchingError: an item's refusal or failure (the others stop at the next step).
    """
    with _counted(call):
        streams = await _submitted(call, items)
        tasks = [asyncio.ensure_future(_whole(call, stream)) for stream in streams]
        disconnected = call.caller.disconnected
        watcher = asyncio.ensure_future(disconnected()) if disconnected is not None else None
        gone = False
        try:
            remaining: set[asyncio.Task[Generation]] = set(tasks)
            while remaining and not gone:
                waited = remaining if watcher is None else remaining | {watcher}
                done, _ = await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
                gone = watcher in done
                remaining -= done
                if any(task.exception() for task in done if task is not watcher):
                    break
        finally:
            if watcher is not None:
                watcher.cancel()
            stopped = [task for task in tasks if not task.done()]
            for task in stopped:
                task.cancel()
            if stopped:
                await asyncio.gather(*stopped, return_exceptions=True)
        if gone:
            raise ClientGone("the client went away before its answer")
        failures = [task.exception() for task in tasks if not task.cancelled()]
        for failure in failures:
            if failure is not None:
                raise failure
        return [task.result() for task in tasks]


async def _whole(call: Call, stream: Stream) -> Generation:
    generation = await _first(call, stream)
    await generation.complete()
    return generation
