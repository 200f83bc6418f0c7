"""What every fused step (:mod:`.fused_step`) does alike in each layer's attention: a decode
step writes its new column of keys and values into the running batch's cache buffers and
attends over the live columns (:func:`attend_in_cache`); a prefill appends its prompts' keys
and values to the prefill's cache and attends causally (:func:`attend_prompt`, with the mask
of :func:`prompt_mask`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import DynamicCache

__all__ = ["Attend", "attend_in_cache", "attend_prompt", "prompt_mask"]

#: One layer's attention inside a fused computation: ``(layer, query [rows, heads, tokens,
#: dim], key, value [rows, key heads, tokens, dim])`` to the heads side by side ``[rows *
#: tokens, heads * dim]``.
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def attend_in_cache(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    buffers: tuple[torch.Tensor, torch.Tensor],
    columns: tuple[int, int],
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One layer's attention of one new token per row: ``key`` and ``value`` (``[rows, key
    heads, dim]``) written at column ``end`` of ``buffers`` (the layer's key and value
    buffers), then ``query`` (``[rows, heads, 1, dim]``) attends over columns ``[start,
    end]`` where ``mask`` (``[rows, 1, 1, columns]``, boolean) allows. Fewer key heads than
    query heads: grouped-query attention. Returns ``[rows, heads * dim]``, the heads side by
    side."""
    rows, heads = int(query.shape[0]), int(query.shape[1])
    start, end = columns
    keys, values = buffers
    keys[:rows, :, end] = key
    values[:rows, :, end] = value
    attended = F.scaled_dot_product_attention(
        query,
        keys[:rows, :, start : end + 1],
        values[:rows, :, start : end + 1],
        attn_mask=mask,
        scale=scale,
        enable_gqa=int(key.shape[1]) != heads,
    )
    # One query per row: [rows, heads, 1, dim] is already the heads side by side.
    return attended.reshape(rows, heads * int(query.shape[-1]))


def prompt_mask(mask: torch.Tensor, tokens: int) -> torch.Tensor:
    """Which columns each of a prefill's ``tokens`` new positions attends to
    (``[rows, 1, tokens, columns]``, boolean), from the cache's mask ``[rows, columns]``
    (nonzero: a real token; its last ``tokens`` columns are the new ones): the real columns up
    to its own. A padding position attends to itself alone, so no row is all masked (softmax
    would give NaN); no real position ever attends to it."""
    columns = int(mask.shape[1])
    past = columns - tokens
    causal = torch.ones(tokens, columns, dtype=torch.bool, device=mask.device).tril(past)
    allowed = (mask != 0)[:, None, None, :] & causal
    itself = torch.zeros(tokens, columns, dtype=torch.bool, device=mask.device)
    itself[:, past:] = torch.eye(tokens, dtype=torch.bool, device=mask.device)
    return allowed | itself


def attend_prompt(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cache: DynamicCache,
    layer: int,
    allowed: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One layer's attention of a prefill: ``key`` and ``value`` (``[rows, key heads, tokens,
    dim]``) appended to layer ``layer`` of ``cache`` (after its past columns, if any), then
    ``query`` (``[rows, heads, tokens, dim]``) attends where ``allowed`` (:func:`prompt_mask`)
    says. Returns ``[rows * tokens, heads * dim]``."""
    rows, heads, tokens, dim = (int(size) for size in query.shape)
    keys, values = cache.update(key, value, layer)
    attended = F.scaled_dot_product_attention(
        query,
        keys,
        values,
        attn_mask=allowed,
        scale=scale,
        enable_gqa=int(key.shape[1]) != heads,
    )
    return attended.transpose(1, 2).reshape(rows * tokens, heads * dim)
