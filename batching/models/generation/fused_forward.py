"""What every fused step (:mod:`.fused_step`) does alike around its layers: a decode step
attends over the running batch's cache buffers (:func:`~.step_attention.attend_in_cache`), a
prefill appends to its own cache and attends causally
(:func:`~.step_attention.attend_prompt`); both run the architecture's layers
(``_logits``, each architecture's own) with that attention."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import DynamicCache

from .packed_products import Product, pack_products
from .step_attention import Attend, attend_in_cache, attend_prompt, prompt_mask

__all__ = ["FusedForward"]


class FusedForward(ABC):
    """A model's fused decode step (``__call__``) and prefill (:meth:`prefill`), over its
    architecture's :meth:`_logits`."""

    #: The attention's scale (the model's own).
    scale: float
    #: Each layer's weight products (:mod:`.packed_products`).
    products: list[list[Product]]

    def pack(self) -> str | None:
        """Serve the layers' products prepacked where that measures faster
        (:func:`.packed_products.pack_products`): what was measured and decided."""
        return pack_products(self.products)

    def __call__(
        self,
        last: Tensor,
        positions: Tensor,
        keys: Sequence[Tensor],
        values: Sequence[Tensor],
        columns: tuple[int, int],
        mask: Tensor,
    ) -> Tensor:
        """The next-token logits ``[rows, vocabulary]`` of one step
        (:class:`.fused_step.FusedStep`)."""
        attend_mask = (mask != 0)[:, None, None, :]

        def attend(index: int, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
            buffers = (keys[index], values[index])
            return attend_in_cache(
                query, key[:, :, 0], value[:, :, 0], buffers, columns, attend_mask, self.scale
            )

        with torch.inference_mode():
            return self._logits(last[:, None], positions[:, None], attend)

    def prefill(self, ids: Tensor, positions: Tensor, mask: Tensor, cache: DynamicCache) -> Tensor:
        """The next-token logits ``[rows, vocabulary]`` after each prompt
        (:meth:`.fused_step.FusedStep.prefill`)."""
        allowed = prompt_mask(mask, int(ids.shape[1]))

        def attend(index: int, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
            return attend_prompt(query, key, value, cache, index, allowed, self.scale)

        with torch.inference_mode():
            return self._logits(ids, positions, attend)

    @abstractmethod
    def _logits(self, ids: Tensor, positions: Tensor, attend: Attend) -> Tensor:
        """Every layer over ``ids`` (``[rows, tokens]``, at ``positions``), each attending
        through ``attend``; the logits after each row's last token."""
