"""A decode step computed by calling torch's operators directly, instead of through
transformers' modules, for the architectures it knows: GPT-2 (:mod:`.gpt2_step`) and the
Llama family (Llama, Mistral, Qwen2: :mod:`.llama_step`).

Why: a decode step computes one token per running row, so its matrices are small and what a
step costs beyond its arithmetic is the work around each operator: the modules' calls, the
mask transformers builds at every step, the cache's bookkeeping and activations written as
several elementwise operators, which these steps leave out. ``benchmarks/decode_profile.py``
measures both paths (on two cores, 16 rows of the benchmark's GPT-2: a forward of 6.20 ms
through transformers, 4.58 ms here, for logits equal within 1e-5); ``BATCHING_FUSED_STEP=0``
turns this path off.

A step reads and writes the running batch's own cache buffers
(:class:`~.causal_batch.DecodeBatch`'s window): each layer writes its new column in place and
attends over the live columns. A prefill (the newcomers' prompts, left-padded, after the
prefixes the prefix cache found) is computed the same way into the prefill's cache: a lone request's
prefill of the benchmark's GPT-2 took 7.48 ms against 10.26 ms through transformers
(``decode_profile.py``'s medians, the two interleaved), a first token sooner by as much. A
prefill that echoes its prompt's log-probabilities (it needs every position's hidden state)
keeps transformers' forward.

:func:`fused_step_of` builds one for a model it can compute exactly as transformers does, on
the CPU in fp32, and None for any other: those keep transformers' forward. A loaded model
builds one (:class:`~.causal.TextGenerator`), which every running batch of it shares; its
weight products are then served from oneDNN-prepacked copies at the row counts where that
measured faster (:meth:`FusedStep.pack`, :mod:`.packed_products`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from transformers import DynamicCache

from .gpt2_step import gpt2_step_of
from .llama_step import llama_step_of

__all__ = ["FUSED_STEP_VARIABLE", "FusedStep", "fused_step_of"]

#: Set to ``0`` to compute every step through transformers' forward (for comparison).
FUSED_STEP_VARIABLE = "BATCHING_FUSED_STEP"


class FusedStep(Protocol):
    """One model's decode step."""

    def __call__(
        self,
        last: torch.Tensor,
        positions: torch.Tensor,
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
        columns: tuple[int, int],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """The next-token logits ``[rows, vocabulary]`` of one step.

        :param last: each row's last token ``[rows]``.
        :param positions: each row's position for it ``[rows]``.
        :param keys: per layer, the cache's key buffer ``[row capacity, heads, column
            capacity, head dim]``; ``values`` alike. The step writes its column at ``end``.
        :param columns: ``(start, end)``: the live columns before this step.
        :param mask: which columns of ``[start, end]`` each row attends to ``[rows, end -
            start + 1]`` (nonzero: a real token).
        """
        ...

    def pack(self) -> str | None:
        """Serve the layers' weight products prepacked where that measures faster
        (:mod:`.packed_products`); what was measured and decided (None: not a candidate).
        Called once, when the model loads."""
        ...

    def prefill(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """The next-token logits ``[rows, vocabulary]`` after each of a prefill's prompts.

        :param ids: the tokens to run ``[rows, tokens]``, left-padded.
        :param positions: each token's position ``[rows, tokens]``.
        :param mask: the cache's columns, the past ones and these ``[rows, past + tokens]``
            (nonzero: a real token).
        :param cache: holds the past columns (the prefixes found), if any; each layer's keys
            and values of ``ids`` are appended to it.
        """
        ...


def fused_step_of(model: Any) -> FusedStep | None:
    """A fused step for ``model`` if one computes it exactly as transformers' forward would,
    else None (and always None when ``BATCHING_FUSED_STEP=0``)."""
    if os.environ.get(FUSED_STEP_VARIABLE, "1") == "0":
        return None
    weights = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    if weights is None or weights.device.type != "cpu" or weights.dtype != torch.float32:
        return None
    return gpt2_step_of(model) or llama_step_of(model)
