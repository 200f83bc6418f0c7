"""The running batch of a causal LM (text-generation): the cache of the rows that
:class:`~.running.RunningBatchBase` joins, steps and lets leave.

Why our own loop and not transformers' continuous-batching manager: the manager
(``init_continuous_batching``/``generate_batch``) runs on CPU since 5.x, but it switches the
model to paged attention (a normal forward on the same model then fails), it sizes its cache
from the machine's total RAM, and it takes no per-request logits processors (ours sample each
row with its own seeded generator and stop on per-row strings). ``benchmarks/generation.py``
measures it beside this loop. The cache is transformers' ``DynamicCache`` whose layers are
views of buffers this batch owns (:class:`_Window`: rows by columns, with room to grow):

- **join**: the newcomers of one turn are prefilled together, in one forward left-padded to
  the longest (an attention mask and position ids that count real tokens only: each row's
  cache and first token are what it would get alone; what the instance keeps of their
  prompts' prefixes is not computed again: :mod:`.prefix_prefill`); their cache rows are
  copied into free rows of the buffers, right-aligned with the batch's columns (the shorter
  side is padding, hidden by the attention mask);
- **step**: one forward of the last token of every running row; each layer writes its new
  column into the buffers in place (no copy of the cache, which ``DynamicCache``'s own
  concatenation made at every step);
- **leave**: a finished row's place is taken by one of the last rows (only that row is
  copied), and columns that are padding for every remaining row are cut by moving the
  window's start; the buffers are dropped when the batch empties, so memory follows the live
  sequences. When a step or a newcomer needs room they lack, they grow by half again.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence as Seq
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .fused_step import FusedStep
from .logprobs import capture_hidden, prompt_echo, prompt_logprobs
from .prefix_prefill import Prefill, Prefixes
from .running import Prompt, Row, RunningBatchBase, pad

__all__ = ["DecodeBatch", "cache_layers", "check_cache"]


#: The most memory an idle running batch keeps of its cache's buffers (:meth:`_Window.idle`).
IDLE_BUFFER_BYTES = 16 << 20


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

    def idle(self) -> bool:
        """Empty the window, keeping its buffers when they hold at most
        :data:`IDLE_BUFFER_BYTES` (whether it kept them): a lone request after another then
        writes into them instead of allocating and zeroing new ones on its way to its first
        token. Larger ones are given back (memory follows the live sequences)."""
        self.count, self.start, self.end = 0, 0, 0
        held = sum(buffer.numel() * buffer.element_size() for buffer in self.keys + self.values)
        return 0 < held <= IDLE_BUFFER_BYTES

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


class DecodeBatch(RunningBatchBase[tuple[DynamicCache, torch.Tensor]]):
    """The running batch of one causal-LM instance: its rows (:class:`~.running.Row`), their
    cache in a :class:`_Window` and their attention mask.

    Built as :class:`~.running.RunningBatchBase` is (``model``: the loaded transformers
    causal LM; ``eos``: the token ids that end a row).
    """

    window: _Window
    cache: DynamicCache | None
    #: The model's decode step computed without its modules (:mod:`.fused_step`), or None:
    #: transformers' forward computes every step.
    fused: FusedStep | None = None
    #: The instance's prompt prefixes (:mod:`.prefix_cache`); None: none kept.
    prefixes: Prefixes | None = None

    @functools.cached_property
    def layers(self) -> int:
        """The model's key/value layers (each a plain one: :func:`check_cache`)."""
        return len(DynamicCache(config=self.model.config).layers)

    def prefix_of(self, prompt: Prompt) -> list[int]:
        return prompt.ids

    # -- join -------------------------------------------------------------------------------

    def _prefill(self, rows: list[Row]) -> tuple[torch.Tensor, tuple[DynamicCache, torch.Tensor]]:
        """The newcomers in one forward, left-padded to the longest, with an attention mask
        and position ids that count real tokens only; what the prefix cache holds of their
        prompts is not computed again (:mod:`.prefix_prefill`)."""
        # A row echoing its prompt's log-probabilities needs every prompt position computed:
        # such a turn reuses no prefix (its blocks are still kept for later turns).
        echoed = [row for row in rows if row.prompt.echo and row.prompt.logprobs is not None]
        logits, prefill, hidden = self._run(
            [row.prompt.ids for row in rows], count=self.recount, whole=bool(echoed)
        )
        width = int(prefill.input_ids.shape[1])
        for row in echoed:
            index, length = rows.index(row), len(row.prompt.ids)
            logprobs = prompt_logprobs(
                self.model,
                self.tokenizer,
                hidden[0][index, width - length :],
                row.prompt.ids,
                row.prompt.logprobs or 0,
                logits[index],
            )
            row.echo = prompt_echo(self.tokenizer, row.prompt.ids, logprobs)
        return logits, (prefill.cache, prefill.mask)

    def _run(
        self, prompts: list[list[int]], count: bool = True, whole: bool = False
    ) -> tuple[torch.Tensor, Prefill, list[torch.Tensor]]:
        """One forward of ``prompts`` (after one of the prefixes several of them share and the
        cache lacks); their new blocks kept. ``count``: their finds are counted. ``whole``:
        every prompt computed from its start, and the last hidden states captured."""
        prefixes = None if whole else self.prefixes
        shared = prefixes.shared(prompts) if prefixes is not None else []
        if shared:
            # Prefixes several newcomers share and the cache lacks: computed once, first.
            self._run(shared, count=False)
        prefill = Prefill.of(prompts, self.pad, prefixes, self.layers, self.device, count=count)

        fused = None if whole else self.fused

        def forward() -> torch.Tensor:
            if fused is not None:
                return fused.prefill(
                    prefill.input_ids, prefill.positions, prefill.mask, prefill.cache
                )
            with torch.inference_mode():
                output = self.model(
                    input_ids=prefill.input_ids,
                    attention_mask=prefill.mask,
                    position_ids=prefill.positions,
                    cache=prefill.cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
            logits: torch.Tensor = output.logits[:, -1]
            return logits

        capture: AbstractContextManager[list[torch.Tensor]] = (
            capture_hidden(self.model) if whole else nullcontext([])
        )
        tokens = int(prefill.input_ids.numel())
        with capture as hidden:
            logits = self.threads.run(self.threads.prefills, len(prompts), tokens, forward)
        prefill.keep(self.prefixes)
        return logits, prefill, hidden

    def _append(self, rows: list[Row], joined: tuple[DynamicCache, torch.Tensor]) -> None:
        """The newcomers' cache rows copied into free rows of the buffers, right-aligned with
        the batch's columns (the shorter side is padding, hidden by the attention mask)."""
        cache, mask = joined
        window, width = self.window, int(mask.shape[1])
        layers = cache_layers(cache)
        if not self.rows:
            # An empty window: the newcomers' columns from its first one, in the buffers an
            # idle batch kept when they fit.
            window.count, window.start, window.end = 0, width, width
        start = min(window.start, window.end - width)
        like = [layer.keys for layer in layers if layer.keys is not None]
        window.reserve(window.count + len(rows), start, window.end, like)
        start = min(window.start, window.end - width)
        fresh = slice(window.count, window.count + len(rows))
        columns = slice(window.end - width, window.end)
        for index, layer in enumerate(layers):
            assert layer.keys is not None and layer.values is not None
            window.keys[index][fresh, :, columns] = layer.keys
            window.values[index][fresh, :, columns] = layer.values
        if self.mask is None or not self.rows:
            self.mask = pad(mask, window.end - start, 1)
        else:
            width = window.end - start
            self.mask = torch.cat([pad(self.mask, width, 1), pad(mask, width, 1)])
        window.start = start
        window.count += len(rows)
        self.rows.extend(rows)
        if self.cache is None:
            self.cache = DynamicCache()
            self.cache.layers = [_WindowLayer(window, i) for i in range(len(layers))]

    # -- step -------------------------------------------------------------------------------

    def _forward(self, last: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Each layer writes its new column into the buffers in place."""
        assert self.cache is not None and self.mask is not None
        window = self.window
        if window.end >= window.columns_capacity:
            window.reserve(window.count, window.start, window.end + 1, window.keys)
        positions = self.mask.sum(dim=1, keepdim=True)
        fused = self.fused
        if fused is not None:
            stepped = fused(
                last[:, 0],
                positions[:, 0],
                window.keys,
                window.values,
                (window.start, window.end),
                mask,
            )
            window.end += 1
            return stepped
        with torch.inference_mode():
            output = self.model(
                input_ids=last,
                attention_mask=mask,
                position_ids=positions,
                cache=self.cache,
                use_cache=True,
            )
        window.end += 1
        logits: torch.Tensor = output.logits[:, -1]
        return logits

    # -- leave ------------------------------------------------------------------------------

    def _reorder(self, gone: list[int]) -> list[int]:
        """The last rows move into the freed ones (only their rows are copied)."""
        kept = len(self.rows) - len(gone)
        holes = [index for index in gone if index < kept]
        gone_set = set(gone)
        movers = [index for index in range(kept, len(self.rows)) if index not in gone_set]
        self.window.move_rows(movers, holes)
        order = list(range(len(self.rows)))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        self.window.count = kept
        return order[:kept]

    def _cut(self, first: int) -> None:
        self.window.start += first

    def _after_leave(self) -> None:
        self.window.shrink()

    def _clear(self) -> None:
        window = getattr(self, "window", None)
        if window is not None and window.idle():
            return  # its buffers and the cache's layers over them serve the next rows
        self.cache = None
        self.window = _Window()


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
