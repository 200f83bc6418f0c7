"""Pooling: one vector per text from its tokens' vectors, as sentence-transformers' ``Pooling``
module computes it (6.x, ``_forward_padded``), for every mode a folder may declare, with right
or left padding, and with prompt tokens left out when the folder says ``include_prompt: false``.

Unlike sentence-transformers, whose batch shares one prompt, each row here may carry its own
prompt length (requests with different prompts share batches).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._torch import mean_pool

__all__ = ["LEGACY_POOLING_FLAGS", "POOLING_MODES", "exclude_prompt", "pool"]

#: Every mode ``1_Pooling/config.json`` may name.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")

#: The legacy boolean flags, in the order sentence-transformers concatenates their modes.
LEGACY_POOLING_FLAGS: dict[str, str] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def exclude_prompt(mask: torch.Tensor, prompt_lengths: torch.Tensor) -> torch.Tensor:
    """``mask`` with each row's first ``prompt_lengths[i]`` real tokens zeroed (after its left
    padding, if any): sentence-transformers' ``_exclude_prompt_from_mask``, row by row."""
    pad = mask.to(torch.int32).argmax(dim=1)
    positions = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
    cut = positions < (pad + prompt_lengths.to(pad.device)).unsqueeze(1)
    return mask.masked_fill(cut, 0)


def pool(
    hidden: torch.Tensor,
    mask: torch.Tensor,
    modes: Sequence[str],
    prompt_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pooled vectors ``[batch, dim * len(modes)]`` of ``hidden`` ``[batch, seq, dim]``.

    :param mask: the attention mask ``[batch, seq]`` (1 for real tokens, either padding side).
    :param prompt_lengths: per row, prompt tokens to leave out (``include_prompt: false``);
        None keeps every token.
    """
    original = mask
    if prompt_lengths is not None and bool((prompt_lengths > 0).any()):
        mask = exclude_prompt(mask, prompt_lengths)
    vectors = [_one(mode, hidden, mask, original) for mode in modes]
    return vectors[0] if len(vectors) == 1 else torch.cat(vectors, dim=-1)


def _one(
    mode: str, hidden: torch.Tensor, mask: torch.Tensor, original: torch.Tensor
) -> torch.Tensor:
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    if mode in ("mean", "mean_sqrt_len_tokens"):
        return mean_pool(hidden, mask, sqrt_len=mode == "mean_sqrt_len_tokens")
    if mode == "cls":
        # The first real token: index 0 with right padding, later with left padding.
        return hidden[rows, mask.to(torch.int32).argmax(dim=1)]
    if mode == "max":
        return hidden.masked_fill((mask == 0).unsqueeze(-1), float("-inf")).max(dim=1).values
    if mode == "weightedmean":
        # Weights 1, 2, ... by position, counted from the first real token (left padding
        # shifts them), the prompt's positions counted but masked out.
        positions = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype)
        pad = original.to(torch.int32).argmax(dim=1).to(hidden.dtype)
        weights = mask.to(hidden.dtype) * (positions.unsqueeze(0) - pad.unsqueeze(1))
        summed = torch.bmm(weights.unsqueeze(1), hidden).squeeze(1)
        return summed / weights.sum(dim=1, keepdim=True).clamp(min=1e-9)
    if mode == "lasttoken":
        # The last real token: the end with left padding, before the padding with right.
        seq = hidden.shape[1]
        values, flipped = mask.flip(1).max(dim=1)
        flipped = torch.where(values == 0, seq - 1, flipped)
        picked = hidden[rows, seq - flipped - 1]
        return picked * values.unsqueeze(-1).to(hidden.dtype)
    raise ValueError(f"pooling mode {mode!r} is not one of {', '.join(POOLING_MODES)}")
