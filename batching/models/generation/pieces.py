"""What a running batch hands each of its rows at a step (:class:`Piece`), and a generated
sequence's life as one value (:class:`Status`), as vLLM's ``RequestStatus`` keeps it.

A sequence is ``WAITING`` until it joins a running batch, ``RUNNING`` while it generates, then
finished for exactly one reason: its length (``max_new_tokens``), one of its stop strings, the
model's end token, its structured-output constraint allowing no token (a dead end), its
client went away (cancelled), or an error (its own input, the model, its deadline). The
running batch (:mod:`.running`) decides the first four, the scheduler
(:mod:`batching.runtime.scheduler`) the last two. Pure data: no torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from .token_logprobs import Echo, TokenLogprob

__all__ = ["Answer", "Joining", "Piece", "Status"]

#: A generated item's answer, as the model gives it for the whole text
#: (``{"generated_text": ...}``, ``{"summary_text": ...}``, ``{"translation_text": ...}``).
Answer = dict[str, str]


class Status(enum.Enum):
    """Where a sequence is in its life; the finished ones say why it ended."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_LENGTH = "length"
    FINISHED_STOP = "stop"
    FINISHED_END = "end"
    FINISHED_CANCELLED = "cancelled"
    #: A structured-output constraint allowed no next token (not even the end token).
    FINISHED_DEAD_END = "dead_end"
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        return self not in (Status.WAITING, Status.RUNNING)

    @property
    def finish_reason(self) -> str | None:
        """What an answer says of the end (OpenAI's ``finish_reason``): ``length``, or
        ``stop`` for a stop string and for the end token; None for the others."""
        if self is Status.FINISHED_LENGTH:
            return "length"
        if self in (Status.FINISHED_STOP, Status.FINISHED_END):
            return "stop"
        if self is Status.FINISHED_DEAD_END:
            return "error"
        return None


@dataclass(frozen=True, slots=True)
class Piece:
    """What a step did for one row: the token it picked, the text it adds (possibly empty,
    while a character or a possible stop string is incomplete), and, on its last piece, how
    it ended and the model's answer to the whole item."""

    key: int
    token_id: int
    text: str
    #: The finished status this piece ends its row with (None: it goes on).
    finish: Status | None = None
    #: The prompt's tokens, as the model read it (after truncation).
    prompt_tokens: int = 0
    #: On the last piece: the answer to the whole item (what a door that gathers sends).
    answer: Answer | None = None
    #: The token's log-probability, when its request asked (``logprobs``).
    logprobs: TokenLogprob | None = None
    #: On the first piece, when its request asked (``echo``): the prompt as the model read it.
    echo: Echo | None = None


class Joining(NamedTuple):
    """A newcomer to a running batch: its key there, its item, and its place in its request
    (which an error about the item names: ``inputs[2]``)."""

    key: int
    item: object
    place: int = 0
