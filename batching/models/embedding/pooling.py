"""Pooling: one vector per text from its tokens' vectors, as sentence-transformers' ``Pooling``
module computes it (6.x, ``_forward_padded``), for every mode a folder may declare, with right
or left padding, and with prompt tokens left out when the folder says ``include_prompt: false``.

Unlike sentence-transformers, whose batch shares one prompt, each row here may carry its own
prompt length (requests with different prompts share batches).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias, overload

import numpy as np

if TYPE_CHECKING:  # annotations only: torch tensors are pooled without importing torch
    import torch

    #: What pooling takes: numpy arrays, or torch tensors (on any device).
    Values: TypeAlias = np.ndarray | torch.Tensor

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


def exclude_prompt(mask: np.ndarray, prompt_lengths: np.ndarray) -> np.ndarray:
    """``mask`` with each row's first ``prompt_lengths[i]`` real tokens zeroed (after its left
    padding, if any): sentence-transformers' ``_exclude_prompt_from_mask``, row by row."""
    pad = mask.astype(np.int32).argmax(axis=1)
    positions = np.arange(mask.shape[1])[None, :]
    cut = positions < (pad + np.asarray(prompt_lengths))[:, None]
    return np.where(cut, 0, mask)


def _array(value: Values) -> np.ndarray:
    """A numpy array of ``value`` (a numpy array, or a torch tensor on any device)."""
    if isinstance(value, np.ndarray):
        return value
    # A torch tensor: float32 on the CPU, without importing torch.
    if value.is_floating_point():
        value = value.float()
    return np.asarray(value.detach().cpu().numpy())


@overload
def pool(
    hidden: np.ndarray, mask: Values, modes: Sequence[str], prompt_lengths: Values | None = None
) -> np.ndarray: ...


@overload
def pool(
    hidden: torch.Tensor,
    mask: Values,
    modes: Sequence[str],
    prompt_lengths: Values | None = None,
) -> torch.Tensor: ...


def pool(
    hidden: Values,
    mask: Values,
    modes: Sequence[str],
    prompt_lengths: Values | None = None,
) -> Values:
    """The pooled vectors ``[batch, dim * len(modes)]`` of ``hidden`` ``[batch, seq, dim]``, in
    numpy (float32); torch tensors in give a torch tensor out.

    :param mask: the attention mask ``[batch, seq]`` (1 for real tokens, either padding side).
    :param prompt_lengths: per row, prompt tokens to leave out (``include_prompt: false``);
        None keeps every token.
    """
    values = _array(hidden).astype(np.float32, copy=False)
    original = _array(mask)
    kept = original
    if prompt_lengths is not None:
        lengths = _array(prompt_lengths)
        if bool((lengths > 0).any()):
            kept = exclude_prompt(original, lengths)
    vectors = [_one(mode, values, kept, original) for mode in modes]
    pooled = vectors[0] if len(vectors) == 1 else np.concatenate(vectors, axis=-1)
    pooled = np.ascontiguousarray(pooled, dtype=np.float32)
    if not isinstance(hidden, np.ndarray):
        return _to_tensor(pooled, hidden)
    return pooled


def _to_tensor(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    import torch  # only when torch tensors came in: torch is loaded already

    return torch.from_numpy(array).to(like.device)


def mean_pool(hidden: np.ndarray, mask: np.ndarray, sqrt_len: bool = False) -> np.ndarray:
    """Average the token vectors over real tokens only, so padding never shifts the result."""
    weights = mask.astype(hidden.dtype)
    # A batched matmul sums the masked rows without materialising hidden * mask.
    summed = np.matmul(weights[:, None, :], hidden)[:, 0, :]
    counts = np.maximum(weights.sum(axis=1, keepdims=True), 1e-9)
    return summed / (np.sqrt(counts) if sqrt_len else counts)  # type: ignore[no-any-return]


def _one(mode: str, hidden: np.ndarray, mask: np.ndarray, original: np.ndarray) -> np.ndarray:
    rows = np.arange(hidden.shape[0])
    if mode in ("mean", "mean_sqrt_len_tokens"):
        return mean_pool(hidden, mask, sqrt_len=mode == "mean_sqrt_len_tokens")
    if mode == "cls":
        # The first real token: index 0 with right padding, later with left padding.
        return hidden[rows, mask.astype(np.int32).argmax(axis=1)]  # type: ignore[no-any-return]
    if mode == "max":
        masked = np.where((mask == 0)[..., None], np.float32(-np.inf), hidden)
        return masked.max(axis=1)  # type: ignore[no-any-return]
    if mode == "weightedmean":
        # Weights 1, 2, ... by position, counted from the first real token (left padding
        # shifts them), the prompt's positions counted but masked out.
        positions = np.arange(1, hidden.shape[1] + 1, dtype=hidden.dtype)
        pad = original.astype(np.int32).argmax(axis=1).astype(hidden.dtype)
        weights = mask.astype(hidden.dtype) * (positions[None, :] - pad[:, None])
        summed = np.matmul(weights[:, None, :], hidden)[:, 0, :]
        return summed / np.maximum(weights.sum(axis=1, keepdims=True), 1e-9)  # type: ignore[no-any-return]
    if mode == "lasttoken":
        # The last real token: the end with left padding, before the padding with right.
        seq = hidden.shape[1]
        flipped_mask = mask[:, ::-1]
        values = flipped_mask.max(axis=1)
        flipped = flipped_mask.argmax(axis=1)
        flipped = np.where(values == 0, seq - 1, flipped)
        picked = hidden[rows, seq - flipped - 1]
        return picked * values[:, None].astype(hidden.dtype)  # type: ignore[no-any-return]
    raise ValueError(f"pooling mode {mode!r} is not one of {', '.join(POOLING_MODES)}")
