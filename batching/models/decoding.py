"""Iteration-level decoding for text-generation: a running batch of sequences that advances one
token per step, which new sequences join and finished ones leave between any two steps.

Why our own loop and not transformers' continuous-batching manager: the manager
(``init_continuous_batching``/``generate_batch``) runs on CPU since 5.x, but it switches the
model to paged attention (a normal forward on the same model then fails, so the whole-batch
path and the warm-up could not share the model), it sizes its cache from the machine's total
RAM, and it takes no per-request logits processors (ours sample each row with its own seeded
generator and stop on per-row strings). ``benchmarks/generation.py`` measures it beside this
loop. This loop keeps transformers' own ``DynamicCache``:

- **join**: a newcomer is prefilled alone (batch 1, no padding: its cache is exactly what it
  would be alone) and its first token picked from that forward; its cache rows are then
  left-padded (or the batch's are) to a common length and concatenated on the batch axis,
  with an attention mask that hides the padding and position ids that count only real tokens;
- **step**: one forward of the last token of every running row;
- **leave**: a finished row's cache rows are dropped (``batch_select_indices``) and columns
  that are padding for every remaining row are cut, so memory follows the live sequences.

Everything here runs on the model's instance thread (``torch`` releases the GIL); the
scheduler that decides who joins and leaves is :mod:`batching.runtime.decoding`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .generator import Prompt
from .picking import Sequence, Token, advance, pick
from .picking import processors_of as _processors

__all__ = ["DecodeBatch", "Sequence", "Token", "check_cache"]


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
        self.rows: list[Sequence] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [rows, columns] of the cache, 1 = real

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

    def join(self, key: int, prompt: Prompt) -> Token:
        """Prefill ``prompt`` alone, pick its first token and add its rows to the batch."""
        sequence = Sequence(key, prompt, processors=_processors(prompt.settings))
        if prompt.settings.do_sample:
            seed = prompt.row.seed if prompt.row.seed is not None else secrets.randbits(63)
            sequence.generator = torch.Generator(device=self.device).manual_seed(seed)
        ids = torch.tensor([prompt.ids], dtype=torch.long, device=self.device)
        cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            output = self.model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        token = self._pick(sequence, output.logits[0, -1])
        self._append(sequence, cache, len(prompt.ids))
        return self._advance(sequence, token)

    def _append(self, sequence: Sequence, cache: DynamicCache, length: int) -> None:
        mask = torch.ones((1, length), dtype=torch.long, device=self.device)
        if self.cache is None or self.mask is None or not self.rows:
            self.cache, self.mask, self.rows = cache, mask, [sequence]
            return
        width = max(self.columns, length)
        for mine, theirs in zip(_layers(self.cache), _layers(cache), strict=True):
            assert mine.keys is not None and mine.values is not None
            assert theirs.keys is not None and theirs.values is not None
            mine.keys = torch.cat([_pad_left(mine.keys, width), _pad_left(theirs.keys, width)])
            mine.values = torch.cat(
                [_pad_left(mine.values, width), _pad_left(theirs.values, width)]
            )
        self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(mask, width)])
        self.rows.append(sequence)

    # -- step -------------------------------------------------------------------------------

    def step(self) -> list[Token]:
        """One token for every running sequence."""
        if not self.rows or self.cache is None or self.mask is None:
            return []
        last = torch.tensor(
            [[row.new_ids[-1]] for row in self.rows], dtype=torch.long, device=self.device
        )
        positions = self.mask.sum(dim=1, keepdim=True)
        mask = torch.cat([self.mask, torch.ones_like(last)], dim=1)
        with torch.inference_mode():
            output = self.model(
                input_ids=last,
                attention_mask=mask,
                position_ids=positions,
                cache=self.cache,
                use_cache=True,
            )
        self.mask = mask
        logits = output.logits[:, -1]
        return [
            self._advance(row, self._pick(row, logits[index]))
            for index, row in enumerate(self.rows)
        ]

    def _pick(self, sequence: Sequence, logits: torch.Tensor) -> int:
        return pick(sequence, logits, sequence.prompt.ids + sequence.new_ids)

    def _advance(self, sequence: Sequence, token: int) -> Token:
        """Record ``token`` for ``sequence``: the text it adds and whether it ended it."""
        return advance(sequence, token, self.eos, self.tokenizer)

    # -- leave ------------------------------------------------------------------------------

    def leave(self, keys: set[int]) -> None:
        """Drop the sequences in ``keys`` and their cache rows."""
        if not keys:
            return
        kept = [index for index, row in enumerate(self.rows) if row.key not in keys]
        if len(kept) == len(self.rows):
            return
        self.rows = [self.rows[index] for index in kept]
        if not kept or self.cache is None or self.mask is None:
            self.rows, self.cache, self.mask = [], None, None
            return
        self.cache.batch_select_indices(torch.tensor(kept, device=self.device))
        self.mask = self.mask[kept]
        # Columns that are padding in every remaining row hold nothing: cut them.
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first > 0:
            self.mask = self.mask[:, first:]
            for layer in _layers(self.cache):
                assert layer.keys is not None and layer.values is not None
                layer.keys = layer.keys[:, :, first:]
                layer.values = layer.values[:, :, first:]


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
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
