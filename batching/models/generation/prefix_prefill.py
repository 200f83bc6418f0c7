"""What a causal running batch's newcomers are prefilled from (:mod:`.decoding`): their
prompts left-padded to the longest, and the prefixes its :class:`~.prefix_cache.PrefixCache`
holds for them, so that only the rest of each prompt is computed.

- **Inputs**: a newcomer whose prompt starts with ``r`` cached tokens (whole blocks) runs only
  its last ``len - r``; the forward's cache starts with ``past`` columns (the longest prefix
  found) holding each newcomer's prefix right-aligned, and its suffix follows, left-padded to
  the longest suffix. The attention mask marks the real columns (so a row with a shorter
  prefix has a hole between its prefix and its suffix, hidden like padding), and position ids
  count real tokens, so each row's cache and first token are what it would get alone.
- **Kept**: after the forward, each newcomer's whole blocks the cache lacks are copied out of
  the forward's cache (its real columns), one tensor ``[layers, 2, heads, block, head dim]``
  a block, and kept.

With no cache (or a disabled one) the inputs are the plain left-padded prompts.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .prefix_cache import PrefixCache

__all__ = ["Prefill", "Prefixes", "empty_cache", "prefix_cache"]

#: What a block of the cache holds: its keys and values, ``[layers, 2, heads, block, dim]``.
Prefixes = PrefixCache[torch.Tensor]


def prefix_cache(capacity_mb: int, block: int | None = None) -> Prefixes:
    """A prefix cache of ``capacity_mb`` MiB (0: disabled) for a causal LM's blocks."""
    if block is None:
        return PrefixCache(capacity_mb << 20, _bytes_of)
    return PrefixCache(capacity_mb << 20, _bytes_of, block)


def empty_cache(layers: int) -> DynamicCache:
    """An empty cache of ``layers`` plain key/value layers: what ``DynamicCache(config=...)``
    builds for a model :func:`~.causal_batch.check_cache` accepted, without reading the
    config again at every prefill."""
    cache = DynamicCache()
    cache.layers = [DynamicLayer() for _ in range(layers)]  # type: ignore[no-untyped-call]
    return cache


def _bytes_of(value: torch.Tensor) -> int:
    return int(value.nelement()) * int(value.element_size())


@dataclass(slots=True)
class Prefill:
    """One prefill's inputs: the ids to run ``[rows, suffix]``, the attention mask of the
    whole cache ``[rows, past + suffix]``, the position ids of the ids run, the cache holding
    the prefixes found, and how many tokens of each prompt were found."""

    prompts: list[list[int]]
    input_ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    cache: DynamicCache
    reused: list[int]
    #: The cache's columns before the ids run (the longest prefix found).
    past: int

    @classmethod
    def of(
        cls,
        prompts: list[list[int]],
        pad: int,
        prefixes: Prefixes | None,
        layers: int,
        device: torch.device,
        *,
        count: bool = True,
    ) -> Prefill:
        """The inputs of ``prompts`` for a model of ``layers`` plain key/value layers, their
        cached prefixes found in ``prefixes`` (with ``count``, counted as hits and misses)."""
        found = [prefixes.find(ids, count=count) if prefixes else [] for ids in prompts]
        block = prefixes.block if prefixes else 0
        reused = [len(blocks) * block for blocks in found]
        past = max(reused)
        width = max(len(ids) - r for ids, r in zip(prompts, reused, strict=True))
        ids, real = [], []
        for prompt, r in zip(prompts, reused, strict=True):
            suffix = len(prompt) - r
            ids.append([pad] * (width - suffix) + prompt[r:])
            real.append([0] * (past - r) + [1] * r + [0] * (width - suffix) + [1] * suffix)
        mask = torch.tensor(real, dtype=torch.long, device=device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, past:]
        cache = empty_cache(layers)
        if past:
            _fill(cache, found, past)
        input_ids = torch.tensor(ids, dtype=torch.long, device=device)
        return cls(prompts, input_ids, mask, positions, cache, reused, past)

    def keep(self, prefixes: Prefixes | None) -> None:
        """Keep the prompts' whole blocks that ``prefixes`` lacks, from the forward's cache
        (call it once the forward has run)."""
        if prefixes is None or not prefixes.enabled:
            return
        layers = cast(list[DynamicLayer], self.cache.layers)
        for row, prompt in enumerate(self.prompts):
            prefixes.store(prompt, functools.partial(self._block, layers, row, prefixes.block))

    def _block(self, layers: list[DynamicLayer], row: int, size: int, index: int) -> torch.Tensor:
        """Block ``index`` of ``row``'s prompt, copied out of the forward's cache: a prefix
        token sits right-aligned in the past columns, a suffix token right-aligned in the
        whole width."""
        token, reused = index * size, self.reused[row]
        if token < reused:
            start = self.past - reused + token
        else:
            start = int(self.mask.shape[1]) - len(self.prompts[row]) + token
        return _copy(layers, row, slice(start, start + size))


def _fill(cache: DynamicCache, found: list[list[torch.Tensor]], past: int) -> None:
    """The cache's first ``past`` columns: each row's prefix (its blocks joined) right-aligned,
    zeros before it (masked)."""
    joined: dict[int, torch.Tensor] = {}
    rows: list[torch.Tensor | None] = []
    sample: torch.Tensor | None = None
    for blocks in found:
        if not blocks:
            rows.append(None)
            continue
        # Rows with the same prefix find the same block objects: joined once.
        key = id(blocks[-1])
        if key not in joined:
            joined[key] = torch.cat(blocks, dim=3)
        rows.append(joined[key])
        sample = blocks[0]
    assert sample is not None
    count, _, heads, _, dim = sample.shape
    for index in range(count):
        keys = sample.new_zeros((len(found), heads, past, dim))
        values = sample.new_zeros((len(found), heads, past, dim))
        for row, prefix in enumerate(rows):
            if prefix is not None:
                length = int(prefix.shape[3])
                keys[row, :, past - length :] = prefix[index, 0]
                values[row, :, past - length :] = prefix[index, 1]
        cache.update(keys, values, index)


def _copy(layers: list[DynamicLayer], row: int, columns: slice) -> torch.Tensor:
    """One block of ``row``'s keys and values, copied out of the forward's cache."""
    first = layers[0].keys
    assert first is not None
    heads, dim = int(first.shape[1]), int(first.shape[3])
    out = first.new_empty((len(layers), 2, heads, columns.stop - columns.start, dim))
    for index, layer in enumerate(layers):
        assert layer.keys is not None and layer.values is not None
        out[index, 0] = layer.keys[row, :, columns]
        out[index, 1] = layer.values[row, :, columns]
    return out
