"""The data plane of generation token by token: what the streaming doors (OpenAI completions
and chat completions, KServe v2 generate, gRPC ModelStreamInfer) share.

:func:`open_stream` resolves the request's cost in tokens (prompt and ``max_new_tokens``, the
model's own tokenizer), submits it to the model's iteration-level scheduler
(:mod:`batching.runtime.decoding`) and waits for its first piece, so that every refusal and
every failure before the first token (413, 422, 503, 504) is an ordinary error answer, before
a door has sent a byte. :class:`Generation` then yields the pieces as they come; a door that
loses its client calls :meth:`Generation.close`, and the sequence leaves at the next step.
The deadline (the model's ``--timeout-ms``, lowered by the client's) bounds both the first
token and the whole answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from batching.errors import DeadlineExceeded, InvalidRequest, NotReady, Overloaded
from batching.runtime.decoding import Piece, Stream
from batching.runtime.deployment import Deployment
from batching.service import DataPlane

__all__ = ["Generation", "generates", "open_stream"]


def generates(deployment: Deployment) -> bool:
    """Whether ``deployment`` generates token by token (a generating task on thread
    instances: text-generation, summarization, translation, text2text-generation)."""
    return deployment.decoder is not None


@dataclass(eq=False)
class Generation:
    """One request's generation under way: its first piece is already there."""

    plane: DataPlane
    deployment: Deployment
    stream: Stream
    first: Piece | None
    #: The completion so far (what has been yielded).
    text: str = ""
    finish: str | None = None
    prompt_tokens: int = 0
    _counted: bool = field(default=False, repr=False)

    @property
    def completion_tokens(self) -> int:
        return self.stream.generated

    async def parts(self) -> AsyncIterator[tuple[str, bool]]:
        """The text as it is generated, and whether it is the last part (the last one may be
        empty; others are never empty: while a character or a possible stop string is
        incomplete, nothing is yielded).

        :raises DeadlineExceeded: the deadline passed before the answer ended.
        :raises BatchingError: the sequence failed.
        """
        piece = self.first
        self.first = None
        try:
            while piece is not None:
                self.prompt_tokens = piece.prompt_tokens or self.prompt_tokens
                self.text += piece.text
                if piece.finish is not None:
                    self.finish = piece.finish
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
        if self.finish is None:
            self.stream.cancel()
        if not self._counted:
            self._counted = True
            self.plane.metrics.generated_tokens.labels(self.deployment.name).inc(
                self.stream.generated
            )


async def open_stream(
    plane: DataPlane,
    deployment: Deployment,
    item: Any,
    *,
    deadline: float,
    request_id: str = "",
) -> Generation:
    """Submit ``item`` (a text or a chat, with its parameters) to the model's decode loop and
    wait for its first piece.

    :raises InvalidRequest: the model does not generate token by token.
    :raises PayloadTooLarge: the request needs more tokens than the model holds.
    :raises Overloaded: the model's token budget is full (503, Retry-After).
    :raises DeadlineExceeded: no first token before the deadline.
    """
    decoder = deployment.decoder
    if decoder is None:
        raise InvalidRequest(
            f"model {deployment.name!r} does not generate text token by token (a "
            "text-generation, summarization, translation or text2text-generation model on "
            "thread instances does)"
        )
    decoder.admit()  # a stream refused whatever its length costs no counting
    counts = await plane.count_tokens(deployment, [item], request_id=request_id)
    tokens = counts.used[0] if counts.used else 1
    try:
        stream = decoder.submit(item, tokens, deadline, request_id)
    except Overloaded:
        plane.refused(deployment.name, "overloaded")
        raise
    started = plane.now()
    try:
        first = await stream.next()
    except DeadlineExceeded:
        plane.refused(deployment.name, "deadline")
        raise
    except NotReady:
        plane.refused(deployment.name, "not_ready")
        raise
    except BaseException:
        stream.cancel()
        raise
    plane.metrics.first_token.labels(deployment.name).observe(plane.now() - started)
    return Generation(plane, deployment, stream, first)
