"""What every fused decode step (:mod:`.fused_step`) does alike in each layer: write the new
column of keys and values into the running batch's cache buffers, and attend over the live
columns."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["attend_in_cache"]


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
