"""Iteration-level decoding for text-generation: a running batch of sequences that advances one
token per step, which new sequences join and finished ones leave between any two steps.

Why our own loop and not transformers' continuous-batching manager: the manager
(``init_continuous_batching``/``generate_batch``) runs on CPU since 5.x, but it switches the
model to paged attention (a normal forward on the same model then fails, so the whole-batch
path and the warm-up could not share the model), it sizes its cache from the machine's total
RAM, and it takes no per-request logits processors (ours sample each row with its own seeded
generator and stop on per-row strings). ``benchmarks/generation.py`` measures it beside this
loop. The cache is transformers' ``DynamicCache`` whose layers are views of buffers this
batch owns (:class:`_Window`: rows by columns, with room to grow):

- **join**: the newcomers of one turn are prefilled together, in one forward left-padded to
  the longest (an attention mask and position ids that count real tokens only: each row's
  cache and first token are what it would get alone), and their first tokens picked from
  it; their cache rows are copied into free rows of the buffers, right-aligned with the
  batch's columns (the shorter side is padding, hidden by the attention mask);
- **step**: one forward of the last token of every running row; each layer writes its new
  column into the buffers in place (no copy of the cache, which ``DynamicCache``'s own
  concatenation made at every step), and one ``argmax`` picks the token of every greedy row;
- **leave**: a finished row's place is taken by one of the last rows (only that row is
  copied), and columns that are padding for every remaining row are cut by moving the
  window's start; the buffers are dropped when the batch empties, so memory follows the live
  sequences. When a step or a newcomer needs room they lack, they grow by half again.

The forwards run on the thread count the thread governor learns for their number of rows
(:mod:`.engines.governor`), as whole batches do: beside other work a step on fewer threads
can be many times faster.

Everything here runs on the model's instance thread (``torch`` releases the GIL); the
scheduler that decides who joins and leaves is :mod:`batching.runtime.decoding`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .engines.contention import Contention
from .engines.cores import CORES
from .engines.governor import ThreadGovernor, thread_choices
from .engines.options import ADAPTIVE_THREADS_VARIABLE, thread_budget
from .generator import Prompt
from .picking import Sequence, Token, advance, pick, sequence_of

__all__ = ["DecodeBatch", "Sequence", "Token", "cache_layers", "check_cache"]


class _Window:
    """Where the running batch's cache lives: per layer, a key and a value buffer
    ``[row capacity, heads, column capacity, head dim]`` of which rows ``[0, count)`` and
    columns ``[start, end)`` are in use. Steps write their column in place; rows join and leave
    by copying only their own rows; padding columns are cut by moving ``start``. The buffers
    grow by half again only when a step or a newcomer needs room they do not have."""

    __slots__ = ("count", "end", "keys", "start", "values")

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.count = 0
        self.start = 0
        self.end = 0

    @property
    def rows_capacity(self) -> int:
        return int(self.keys[0].shape[0]) if self.keys else 0

    @property
    def columns_capacity(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0

    def reserve(self, rows: int, start: int, end: int, like: Seq[torch.Tensor]) -> None:
        """Make room for ``rows`` rows and columns ``[start, end)`` (in the window's present
        coordinates, ``start`` may be negative): the live part moves to new buffers if the
        present ones are too small. ``like``: one layer's tensor [*, heads, *, dim] per layer,
        for the shapes of empty buffers."""
        if rows <= self.rows_capacity and start >= 0 and end <= self.columns_capacity:
            return
        self._reallocate(rows, start, end, like)

    def shrink(self) -> None:
        """Smaller buffers when the live part fills under half the rows or columns (memory
        follows the live sequences, not the largest batch seen)."""
        span = self.end - self.start
        if self.rows_capacity > 2 * max(self.count, 4) or self.columns_capacity > 2 * (span + 32):
            self._reallocate(self.count, self.start, self.end, self.keys)

    def _reallocate(self, rows: int, start: int, end: int, like: Seq[torch.Tensor]) -> None:
        span = end - start
        row_room = max(rows + rows // 2, 4)
        left = span // 4 + 8 if start < 0 else 0
        column_room = left + span + span // 2 + 32
        shift = left - start
        keys, values = [], []
        for index, sample in enumerate(like):
            shape = (row_room, sample.shape[1], column_room, sample.shape[3])
            fresh = (sample.new_zeros(shape), sample.new_zeros(shape))
            if self.keys and self.count:
                old = slice(self.start, self.end)
                new = slice(self.start + shift, self.end + shift)
                fresh[0][: self.count, :, new] = self.keys[index][: self.count, :, old]
                fresh[1][: self.count, :, new] = self.values[index][: self.count, :, old]
            keys.append(fresh[0])
            values.append(fresh[1])
        self.keys, self.values = keys, values
        self.start += shift
        self.end += shift

    def move_rows(self, sources: list[int], targets: list[int]) -> None:
        """Copy the live columns of rows ``sources`` onto rows ``targets``."""
        if not sources:
            return
        source = torch.tensor(sources, device=self.keys[0].device)
        target = torch.tensor(targets, device=self.keys[0].device)
        columns = slice(self.start, self.end)
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer[target, :, columns] = buffer[source, :, columns]


class _WindowLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """One layer of the running batch's cache as the model sees it: its keys and values are
    views of the window's buffers; a forward writes the new columns in place after
    ``end`` (the batch moves ``end`` once the forward is done)."""

    def __init__(self, window: _Window, index: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.window = window
        self.index = index
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.window
        rows, added = key_states.shape[0], key_states.shape[2]
        new = slice(window.end, window.end + added)
        keys, values = window.keys[self.index], window.values[self.index]
        keys[:rows, :, new] = key_states
        values[:rows, :, new] = value_states
        self.keys = keys[:rows, :, window.start : window.end + added]
        self.values = values[:rows, :, window.start : window.end + added]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.window.end - self.window.start

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0


class _Threads:
    """The intra-op threads of the loop's forwards, learnt as the whole batches' are
    (:mod:`.engines.governor`): a team as large as the budget where the cores are free, fewer
    beside other work (there a team of two can run a step ten times as long). Steps and
    prefills learn apart (their costs per token differ), each by its number of rows."""

    def __init__(self) -> None:
        budget = thread_budget()
        choices = thread_choices(budget)
        self.fixed = os.environ.get(ADAPTIVE_THREADS_VARIABLE, "1") == "0" or len(choices) < 2
        self.contention = None if self.fixed else Contention.for_budget(budget)
        others = self.contention.others if self.contention is not None else None
        self.steps = ThreadGovernor(choices, others)
        self.prefills = ThreadGovernor(choices, others)

    def run(
        self, governor: ThreadGovernor, rows: int, tokens: int, forward: Callable[[], Any]
    ) -> Any:
        """``forward()`` on the thread count ``governor`` picks for ``rows`` rows, timed."""
        if self.fixed:
            return forward()
        threads = governor.pick(rows, CORES.granted())
        before = torch.get_num_threads()
        if before != threads:
            torch.set_num_threads(threads)
        started = time.perf_counter()
        try:
            result = forward()
        finally:
            # The whole batches that share the instance's thread keep their own count.
            if before != threads:
                torch.set_num_threads(before)
        seconds = time.perf_counter() - started
        governor.observe(rows, tokens, threads, seconds)
        if self.contention is not None:
            self.contention.ran(threads, seconds)
        return result


class DecodeBatch:
    """The running batch of one instance: its sequences, their cache and attention mask.

    :param model: the loaded transformers causal LM.
    :param tokenizer: its tokenizer.
    :param eos: the token ids that end a sequence.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        eos: Seq[int],
        prepare: Callable[[int, Any], Prompt] | None = None,
    ) -> None:
        self.model = model
        self.prepare = prepare
        self.tokenizer = tokenizer
        self.eos = frozenset(eos)
        self.device = model.device
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad = pad if isinstance(pad, int) else 0
        self.rows: list[Sequence] = []
        self.window = _Window()
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [rows, columns] of the cache, 1 = real
        self.threads = _Threads()

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def columns(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[1])

    # -- join -------------------------------------------------------------------------------

    def join_item(self, key: int, item: Any) -> Token:
        """Prepare a request's item (tokenise, truncate or refuse) and :meth:`join` it."""
        if self.prepare is None:
            raise RuntimeError("this batch was built without a way to prepare items")
        return self.join(key, self.prepare(0, item))

    def join_items(self, items: Seq[tuple[int, Any]]) -> list[Token | BaseException]:
        """Prepare several requests' items and :meth:`join_many` them in one prefill: each
        gets its first token, or the exception that fails it alone (an item that cannot be
        prepared; if the shared prefill raises, each is retried alone, so only the one that
        fails fails)."""
        if self.prepare is None:
            raise RuntimeError("this batch was built without a way to prepare items")
        outcomes: list[Token | BaseException] = []
        ready: list[tuple[int, Prompt]] = []
        places: list[int] = []
        for key, item in items:
            try:
                ready.append((key, self.prepare(0, item)))
                places.append(len(outcomes))
                outcomes.append(RuntimeError("not joined"))
            except Exception as exc:
                outcomes.append(exc)
        if len(ready) > 1:
            try:
                tokens: list[Token | BaseException] = list(self.join_many(ready))
            except Exception:
                tokens = [self._join_alone(key, prompt) for key, prompt in ready]
        else:
            tokens = [self._join_alone(key, prompt) for key, prompt in ready]
        for place, token in zip(places, tokens, strict=True):
            outcomes[place] = token
        return outcomes

    def _join_alone(self, key: int, prompt: Prompt) -> Token | BaseException:
        try:
            return self.join(key, prompt)
        except Exception as exc:
            return exc

    def join(self, key: int, prompt: Prompt) -> Token:
        """Prefill ``prompt`` alone, pick its first token and add its rows to the batch."""
        return self.join_many([(key, prompt)])[0]

    def join_many(self, prompts: Seq[tuple[int, Prompt]]) -> list[Token]:
        """Prefill ``prompts`` in one forward (left-padded to the longest, with an attention
        mask and position ids that count real tokens only: each row's cache and first token
        are what it would get alone), pick their first tokens and add their rows."""
        sequences = [sequence_of(key, prompt, self.device) for key, prompt in prompts]
        width = max(len(prompt.ids) for _, prompt in prompts)
        ids = [[self.pad] * (width - len(p.ids)) + p.ids for _, p in prompts]
        real = [[0] * (width - len(p.ids)) + [1] * len(p.ids) for _, p in prompts]
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        mask = torch.tensor(real, dtype=torch.long, device=self.device)
        cache = DynamicCache(config=self.model.config)

        def forward() -> Any:
            with torch.inference_mode():
                return self.model(
                    input_ids=input_ids,
                    attention_mask=mask,
                    position_ids=(mask.cumsum(dim=1) - 1).clamp(min=0),
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )

        output = self.threads.run(self.threads.prefills, len(prompts), int(mask.numel()), forward)
        picked = self._pick_all(sequences, output.logits[:, -1])
        pairs = zip(sequences, picked, strict=True)
        tokens = [self._advance(sequence, token) for sequence, token in pairs]
        # Added last: whatever raised before leaves the batch as it was.
        self._append(sequences, cache, mask)
        return tokens

    def _append(self, sequences: list[Sequence], cache: DynamicCache, mask: torch.Tensor) -> None:
        window, width = self.window, int(mask.shape[1])
        layers = cache_layers(cache)
        if not self.rows:
            window.count, window.start, window.end = 0, 0, 0
        start = min(window.start, window.end - width)
        like = [layer.keys for layer in layers if layer.keys is not None]
        window.reserve(window.count + len(sequences), start, window.end, like)
        start = min(window.start, window.end - width)
        rows = slice(window.count, window.count + len(sequences))
        columns = slice(window.end - width, window.end)
        for index, layer in enumerate(layers):
            assert layer.keys is not None and layer.values is not None
            window.keys[index][rows, :, columns] = layer.keys
            window.values[index][rows, :, columns] = layer.values
        if self.mask is None or not self.rows:
            self.mask = _pad_left(mask, window.end - start)
        else:
            self.mask = torch.cat(
                [_pad_left(self.mask, window.end - start), _pad_left(mask, window.end - start)]
            )
        window.start = start
        window.count += len(sequences)
        self.rows.extend(sequences)
        if self.cache is None:
            self.cache = DynamicCache(config=self.model.config)
            self.cache.layers = [_WindowLayer(window, i) for i in range(len(layers))]

    # -- step -------------------------------------------------------------------------------

    def step(self) -> list[Token]:
        """One token for every running sequence."""
        if not self.rows or self.cache is None or self.mask is None:
            return []
        window = self.window
        if window.end >= window.columns_capacity:
            window.reserve(window.count, window.start, window.end + 1, window.keys)
        last = torch.tensor(
            [[row.new_ids[-1]] for row in self.rows], dtype=torch.long, device=self.device
        )
        positions = self.mask.sum(dim=1, keepdim=True)
        mask = torch.cat([self.mask, torch.ones_like(last)], dim=1)
        cache = self.cache

        def forward() -> Any:
            with torch.inference_mode():
                return self.model(
                    input_ids=last,
                    attention_mask=mask,
                    position_ids=positions,
                    cache=cache,
                    use_cache=True,
                )

        rows = len(self.rows)
        output = self.threads.run(self.threads.steps, rows, rows, forward)
        window.end += 1
        self.mask = mask
        picked = self._pick_all(self.rows, output.logits[:, -1])
        return [self._advance(row, token) for row, token in zip(self.rows, picked, strict=True)]

    def _pick_all(self, sequences: Seq[Sequence], logits: torch.Tensor) -> list[int]:
        """Each row's next token: one argmax for all greedy rows without processors, the
        others one by one."""
        picked: list[int] = logits.argmax(dim=-1).tolist()
        for index, sequence in enumerate(sequences):
            if sequence.generator is not None or len(sequence.processors):
                picked[index] = self._pick(sequence, logits[index])
        return picked

    def _pick(self, sequence: Sequence, logits: torch.Tensor) -> int:
        return pick(sequence, logits, sequence.prompt.ids + sequence.new_ids)

    def _advance(self, sequence: Sequence, token: int) -> Token:
        """Record ``token`` for ``sequence``: the text it adds and whether it ended it."""
        return advance(sequence, token, self.eos, self.tokenizer)

    # -- leave ------------------------------------------------------------------------------

    def leave(self, keys: set[int]) -> None:
        """Drop the sequences in ``keys`` and their cache rows: the last rows move into the
        freed ones (only their rows are copied), and columns that are padding for every
        remaining row are cut."""
        if not keys:
            return
        gone = [index for index, row in enumerate(self.rows) if row.key in keys]
        if not gone:
            return
        kept = len(self.rows) - len(gone)
        if kept == 0 or self.mask is None:
            self.rows, self.cache, self.mask = [], None, None
            self.window = _Window()
            return
        holes = [index for index in gone if index < kept]
        gone_set = set(gone)
        movers = [index for index in range(kept, len(self.rows)) if index not in gone_set]
        self.window.move_rows(movers, holes)
        order = list(range(len(self.rows)))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        order = order[:kept]
        self.rows = [self.rows[index] for index in order]
        self.mask = self.mask[order]
        self.window.count = kept
        # Columns that are padding in every remaining row hold nothing: cut them.
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first > 0:
            self.mask = self.mask[:, first:]
            self.window.start += first
        self.window.shrink()


def cache_layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The cache's layers, each a plain full-attention layer (:func:`check_cache`)."""
    return cast(list[DynamicLayer], cache.layers)


def check_cache(config: Any) -> None:
    """Refuse a model whose cache this loop cannot join and cut: sliding-window, linear
    attention or other layers that are not a plain key/value cache.

    :raises NotImplementedError: naming the layer kind.
    """
    for layer in DynamicCache(config=config).layers:
        if type(layer) is not DynamicLayer:
            raise NotImplementedError(
                f"its cache has {type(layer).__name__} layers; only full-attention layers "
                "join a running batch"
            )


def _pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``tensor`` (a mask [rows, columns] or a cache [rows, heads, columns, dim]) padded with
    zeros on the left of its column axis to ``width`` columns."""
    axis = 1 if tensor.dim() == 2 else 2
    missing = width - tensor.shape[axis]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[axis] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=axis)
