"""The running batch of a generating model, whatever its architecture: rows that advance one
token per step, which newcomers join and finished rows leave between any two steps.

:class:`RunningBatchBase` does what both architectures do alike; a causal LM
(:mod:`.causal_batch`) and an encoder-decoder (:mod:`.seq2seq_batch`) say how their cache is
filled, stepped, reordered and cut:

- **join**: the newcomers of a turn are prepared (tokenised, truncated or refused: each
  alone) and prefilled together in one forward; if that shared forward raises, each is tried
  alone, so only the one that fails fails. Each gets its first token, then its rows of the
  cache join the batch's (added last: whatever raised before leaves the batch as it was);
- **step**: one forward of every running row's last token, and each row's next token: one
  argmax for all greedy rows, the others by their own :class:`~.sampling.Sampler`;
- **advance**: a row's new token becomes the text it adds. A row ends at its end token, its
  ``max_new_tokens``, or its first stop string (cut there); text that may be the start of a
  stop string, or an incomplete character, is held back until the next tokens say. A row's
  last piece carries the model's answer to the whole item;
- **leave**: finished rows' cache rows go, and columns that are padding for every remaining
  row are cut.

The forwards run on the thread count the thread governor learns for their number of rows
(:class:`Threads`, :mod:`..engines.governor`), as whole batches do: beside other work a step on
fewer threads can be many times faster. Everything here runs on the model's instance thread
(``torch`` releases the GIL); the scheduler that decides who joins and leaves is
:mod:`batching.runtime.scheduler`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from ..engines.contention import Contention
from ..engines.cores import CORES
from ..engines.engine_options import ADAPTIVE_THREADS_VARIABLE, thread_budget
from ..engines.governor import ThreadGovernor, thread_choices
from .constraints import Constraint, tokenizer_of
from .detokenizer import Decoded, Detokenizer
from .logprobs import prompt_echo, token_logprob
from .pieces import Answer, Joining, Piece, Status
from .sampling import Sampler, constraints, first_max
from .settings import Settings
from .token_logprobs import Echo, TokenLogprob

__all__ = ["Prompt", "Row", "RunningBatchBase", "Threads", "held_back", "pad"]

R = TypeVar("R")
#: What a subclass's prefill hands its append: the newcomers' own cache and masks.
Joined = TypeVar("Joined")


@dataclass(slots=True)
class Prompt:
    """One item, prepared: its text as sent, its token ids as the model reads them, its
    parameters, and what its row generates with (its settings, its own seed and stop
    strings)."""

    text: str
    ids: list[int]
    parameters: dict[str, Any]
    settings: Settings
    #: Its request's ``seed`` (None: a random one, when it samples).
    seed: int | None = None
    stop: tuple[str, ...] = ()
    #: Each new token's log-probability and this many alternatives (None: none).
    logprobs: int | None = None
    #: Its structured-output grammar (:mod:`.grammars`), or None.
    grammar: str | None = None
    #: Its first piece echoes the prompt (with log-probabilities when ``logprobs`` is set).
    echo: bool = False


@dataclass(slots=True, eq=False)
class Row:
    """One item's sequence in the running batch."""

    key: int
    prompt: Prompt
    sampler: Sampler
    #: What the sampler reads before the new tokens (a causal LM's prompt; an
    #: encoder-decoder's decoder start token).
    prefix: list[int]
    new_ids: list[int] = field(default_factory=list)
    #: Characters of the completion already handed out.
    sent: int = 0
    #: What its first piece echoes (``echo``), until it is handed out.
    echo: Echo | None = None
    #: Its new tokens' text so far (:mod:`.detokenizer`).
    decoded: Decoded = field(default_factory=Decoded)

    def seen(self) -> list[int]:
        """The ids the row's processors read: its prefix and new tokens."""
        return self.prefix + self.new_ids


class Threads:
    """The intra-op threads of the loop's forwards, learnt as the whole batches' are
    (:mod:`..engines.governor`): a team as large as the budget where the cores are free, fewer
    beside other work (there a team of two can run a step ten times as long). Steps and
    prefills learn apart (their costs per token differ): steps by their number of rows,
    prefills by their number of tokens: a prefill's cost per token depends on its length (the
    output layer's work is per row, whatever the prompt's length), so a one-thread try on a
    long prompt would look cheaper than the team on a short one and keep every later prefill
    on one thread."""

    def __init__(self) -> None:
        budget = thread_budget()
        choices = thread_choices(budget)
        self.fixed = os.environ.get(ADAPTIVE_THREADS_VARIABLE, "1") == "0" or len(choices) < 2
        self.contention = None if self.fixed else Contention.for_budget(budget)
        others = self.contention.others if self.contention is not None else None
        self.steps = ThreadGovernor(choices, others)
        self.prefills = ThreadGovernor(choices, others)

    def run(self, governor: ThreadGovernor, rows: int, tokens: int, forward: Callable[[], R]) -> R:
        """``forward()`` on the thread count ``governor`` picks for ``rows`` rows of ``tokens``
        tokens in all (a prefill's: for its tokens), timed."""
        if self.fixed:
            return forward()
        size = tokens if governor is self.prefills else rows
        threads = governor.pick(size, CORES.granted())
        before = torch.get_num_threads()
        if before != threads:
            torch.set_num_threads(threads)
        started = time.perf_counter()
        try:
            result = forward()
        finally:
            # The work that shares the instance's thread keeps its own count.
            if before != threads:
                torch.set_num_threads(before)
        seconds = time.perf_counter() - started
        governor.observe(size, tokens, threads, seconds)
        if self.contention is not None:
            self.contention.ran(threads, seconds)
        return result


class RunningBatchBase(Generic[Joined]):
    """The rows of one instance's running batch, their decoder attention mask, and what every
    architecture does with them; a subclass holds the cache.

    :param model: the loaded transformers model.
    :param tokenizer: its tokenizer.
    :param eos: the token ids that end a row.
    :param prepare: turns a request's item into a :class:`~.generator.Prompt` (tokenise,
        truncate or refuse), given its place in its request.
    :param answer: a finished row's answer to its whole item, from its prompt and new ids.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        eos: Iterable[int],
        prepare: Callable[[int, Any], Prompt] | None = None,
        answer: Callable[[Prompt, list[int]], Answer] | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos = frozenset(eos)
        self.prepare = prepare
        self.answer = answer
        self.device: torch.device = model.device
        pad = getattr(tokenizer, "pad_token_id", None)
        #: What padded rows hold where they have no token.
        self.pad = pad if isinstance(pad, int) else 0
        self.rows: list[Row] = []
        #: Whether a prefill counts its prefixes' finds (not when it retries one by one what a
        #: shared prefill counted before it raised).
        self.recount = True
        #: The decoder's cache columns of every row, 1 = real ([rows, columns]).
        self.mask: torch.Tensor | None = None
        self.threads = Threads()
        self.detokenizer = Detokenizer(tokenizer)
        self._clear()

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def columns(self) -> int:
        """The decoder's cache columns (the longest row's tokens and padding)."""
        return 0 if self.mask is None else int(self.mask.shape[1])

    # -- what each architecture says ---------------------------------------------------------

    def prefix_of(self, prompt: Prompt) -> list[int]:
        """What a row's sampler reads before its first new token."""
        raise NotImplementedError

    def _prefill(self, rows: list[Row]) -> tuple[torch.Tensor, Joined]:
        """One forward of ``rows`` (newcomers): their last logits ``[rows, vocab]`` and what
        :meth:`_append` adds to the batch. Changes nothing of the batch."""
        raise NotImplementedError

    def _append(self, rows: list[Row], joined: Joined) -> None:
        """Add the newcomers: their rows, their cache rows and their columns of the mask."""
        raise NotImplementedError

    def _forward(self, last: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One step's forward of every row's ``last`` token under the decoder mask ``mask``
        (the present one and the new column); the last logits ``[rows, vocab]``."""
        raise NotImplementedError

    def _reorder(self, gone: list[int]) -> list[int]:
        """Drop rows ``gone`` (indices, ascending) from the cache: the old index of each
        remaining row, in their new order."""
        raise NotImplementedError

    def _cut(self, first: int) -> None:
        """Cut the decoder cache's first ``first`` columns (padding in every row)."""
        raise NotImplementedError

    def _after_leave(self) -> None:
        """What else a subclass frees once rows have left."""

    def _clear(self) -> None:
        """Drop the whole cache: no row is left (and none has come yet)."""
        raise NotImplementedError

    # -- join -------------------------------------------------------------------------------

    def join_item(self, key: int, item: Any) -> Piece:
        """Prepare a request's item (tokenise, truncate or refuse) and :meth:`join` it."""
        return self.join(key, self._prepared(Joining(key, item)))

    def join_items(self, items: Seq[Joining]) -> list[Piece | BaseException]:
        """Prepare several requests' items and prefill them together: each gets its first
        piece, or the exception that fails it alone (an item that cannot be prepared; if the
        shared prefill raises, each is tried alone, so only the one that fails fails)."""
        outcomes: list[Piece | BaseException] = []
        ready: list[tuple[int, Prompt]] = []
        places: list[int] = []
        for joining in items:
            try:
                ready.append((joining.key, self._prepared(joining)))
            except Exception as exc:
                outcomes.append(exc)
                continue
            places.append(len(outcomes))
            outcomes.append(RuntimeError("not joined"))
        pieces: list[Piece | BaseException] = []
        if len(ready) > 1:
            try:
                pieces = list(self.join_many(ready))
            except Exception:
                pieces = []
        if len(pieces) != len(ready):
            # Their prefixes were looked up (and counted) by the shared try already.
            self.recount = len(ready) == 1
            try:
                pieces = [self._join_alone(key, prompt) for key, prompt in ready]
            finally:
                self.recount = True
        for place, piece in zip(places, pieces, strict=True):
            outcomes[place] = piece
        return outcomes

    def _prepared(self, joining: Joining) -> Prompt:
        if self.prepare is None:
            raise RuntimeError("this batch was built without a way to prepare items")
        return self.prepare(joining.place, joining.item)

    def _join_alone(self, key: int, prompt: Prompt) -> Piece | BaseException:
        try:
            return self.join(key, prompt)
        except Exception as exc:
            return exc

    def join(self, key: int, prompt: Prompt) -> Piece:
        """Prefill ``prompt`` alone, pick its first token and add its rows to the batch."""
        return self.join_many([(key, prompt)])[0]

    def join_many(self, prompts: Seq[tuple[int, Prompt]]) -> list[Piece]:
        """Prefill ``prompts`` in one forward (each row's cache and first token are what it
        would get alone), pick their first tokens and add their rows."""
        rows = [self._row(key, prompt) for key, prompt in prompts]
        logits, joined = self._prefill(rows)
        pieces = self._advance_all(rows, logits)
        # Added last: whatever raised before leaves the batch as it was.
        self._append(rows, joined)
        return pieces

    def _row(self, key: int, prompt: Prompt) -> Row:
        prefix = self.prefix_of(prompt)
        found = constraints(
            self.model.generation_config,
            sorted(self.eos),
            self.device,
            start=len(prefix),
            max_new_tokens=prompt.settings.max_new_tokens,
        )
        constraint = None
        if prompt.grammar is not None:
            vocabulary = int(self.model.get_output_embeddings().weight.shape[0])
            llg = tokenizer_of(self.tokenizer, vocabulary, self.eos)
            constraint = Constraint(llg, prompt.grammar)
        sampler = Sampler(prompt.settings, prompt.seed, found, self.device, constraint)
        echo = prompt_echo(self.tokenizer, prompt.ids) if prompt.echo else None
        return Row(key, prompt, sampler, prefix, echo=echo)

    # -- step -------------------------------------------------------------------------------

    def step(self) -> list[Piece]:
        """One token for every running row."""
        if not self.rows or self.mask is None:
            return []
        last = torch.tensor(
            [[row.new_ids[-1]] for row in self.rows], dtype=torch.long, device=self.device
        )
        mask = torch.cat([self.mask, torch.ones_like(last)], dim=1)
        rows = len(self.rows)
        logits = self.threads.run(self.threads.steps, rows, rows, lambda: self._forward(last, mask))
        self.mask = mask
        return self._advance_all(self.rows, logits)

    def _advance_all(self, rows: Seq[Row], logits: torch.Tensor) -> list[Piece]:
        """Each row's next token (one argmax for all greedy rows without processors, the
        others one by one), recorded."""
        picked: list[int | None] = list(first_max(logits))
        entries: list[TokenLogprob | None] = [None] * len(rows)
        for index, row in enumerate(rows):
            top = row.prompt.logprobs
            if row.sampler.greedy and top is None:
                continue
            scores = row.sampler.scores(logits[index], row.seen())
            token = picked[index] = row.sampler.draw(scores)
            if top is not None and token is not None:
                entries[index] = token_logprob(self.tokenizer, scores, token, top)
        return [
            self._advance(row, token, entry)
            for row, token, entry in zip(rows, picked, entries, strict=True)
        ]

    def _advance(self, row: Row, token: int | None, entry: TokenLogprob | None = None) -> Piece:
        """Record ``token`` for ``row`` (None: its constraint allowed none): the text it adds
        and whether it ended the row."""
        prompt, stops = row.prompt, row.prompt.stop
        finish: Status | None = None
        if token is None:
            finish, token = Status.FINISHED_DEAD_END, -1
        else:
            row.new_ids.append(token)
        if token in self.eos:
            finish = Status.FINISHED_END
        elif len(row.new_ids) >= prompt.settings.max_new_tokens:
            finish = Status.FINISHED_LENGTH
        # Up to its last whole character, unless it ended here.
        text = self.detokenizer.text(row.new_ids, row.decoded, final=finish is not None)
        if stops:
            cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                text, finish = text[:cut], Status.FINISHED_STOP
        if finish is None:
            text = text[: len(text) - held_back(text, stops)]
        added = text[row.sent :]
        row.sent = max(row.sent, len(text))
        answer = None
        if finish is not None and self.answer is not None:
            answer = self.answer(prompt, row.new_ids)
        echo, row.echo = row.echo, None
        return Piece(row.key, token, added, finish, len(prompt.ids), answer, entry, echo)

    # -- leave ------------------------------------------------------------------------------

    def leave(self, keys: set[int]) -> None:
        """Drop the rows in ``keys`` and their cache rows; columns that are padding for every
        remaining row are cut."""
        if not keys:
            return
        gone = [index for index, row in enumerate(self.rows) if row.key in keys]
        if not gone:
            return
        if len(gone) == len(self.rows) or self.mask is None:
            self.rows, self.mask = [], None
            self._clear()
            return
        order = self._reorder(gone)
        self.rows = [self.rows[index] for index in order]
        self.mask = self.mask[order]
        # Columns that are padding in every remaining row (on the left) hold nothing.
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first > 0:
            self.mask = self.mask[:, first:]
            self._cut(first)
        self._after_leave()

    # -- every row at once ------------------------------------------------------------------

    def complete(self, prompts: Seq[Prompt]) -> list[Answer]:
        """Every prompt joining at once, stepped until each has ended: their answers, in
        order (the loop a warm-up runs, and a direct call's)."""
        answers: dict[int, Answer] = {}
        pieces = self.join_many(list(enumerate(prompts)))
        while True:
            ended = {piece.key for piece in pieces if piece.finish is not None}
            for piece in pieces:
                if piece.finish is not None and piece.answer is not None:
                    answers[piece.key] = piece.answer
            self.leave(ended)
            if not self.rows:
                break
            pieces = self.step()
        return [answers[index] for index in range(len(prompts))]


def held_back(text: str, stops: Seq[str]) -> int:
    """How many characters at the end of ``text`` may be the start of a stop string (they
    are not handed out until the next tokens say)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def pad(tensor: torch.Tensor, width: int, axis: int, *, left: bool = True) -> torch.Tensor:
    """``tensor`` padded with zeros to ``width`` along ``axis``, on the left or the right."""
    missing = width - tensor.shape[axis]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[axis] = missing
    zeros = tensor.new_zeros(shape)
    return torch.cat([zeros, tensor] if left else [tensor, zeros], dim=axis)
