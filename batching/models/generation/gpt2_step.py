"""The fused decode step and prefill of a GPT-2 (:mod:`.fused_step` says why and when): layer
norms, one fused query/key/value projection (GPT-2's ``Conv1D``, weights stored
input-major), learned positions, and its activation as one operator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .fused_forward import FusedForward
from .packed_products import Product
from .step_attention import Attend

__all__ = ["GPT2Step", "gpt2_step_of"]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
}


@dataclass(frozen=True, slots=True)
class _Block:
    """One transformer block's weights, as its operators take them."""

    ln1: tuple[torch.Tensor, torch.Tensor]
    attention: Product  # the fused query/key/value projection
    projection: Product
    ln2: tuple[torch.Tensor, torch.Tensor]
    up: Product
    down: Product

    @property
    def products(self) -> list[Product]:
        return [self.attention, self.projection, self.up, self.down]


def _conv1d(module: Any) -> Product:
    """GPT-2's ``Conv1D``: its weight is stored input-major."""
    return Product(module.weight, module.bias, input_major=True)


class GPT2Step(FusedForward):
    """The decode step and prefill of one loaded GPT-2 model (built by
    :func:`gpt2_step_of`)."""

    def __init__(self, model: Any) -> None:
        config = model.config
        body = model.transformer
        self.width = int(config.n_embd)
        self.heads = int(config.n_head)
        self.eps = float(config.layer_norm_epsilon)
        self.scale = 1.0 / math.sqrt(self.width // self.heads) if config.scale_attn_weights else 1.0
        self.activation = _ACTIVATIONS[config.activation_function]
        self.tokens = body.wte.weight
        self.places = body.wpe.weight
        self.final = (body.ln_f.weight, body.ln_f.bias)
        # The module, not its weight: its forward may be a prepacked one
        # (:func:`.packed_products.pack_output_layer`).
        self.head = model.get_output_embeddings()
        self.blocks = [
            _Block(
                (block.ln_1.weight, block.ln_1.bias),
                _conv1d(block.attn.c_attn),
                _conv1d(block.attn.c_proj),
                (block.ln_2.weight, block.ln_2.bias),
                _conv1d(block.mlp.c_fc),
                _conv1d(block.mlp.c_proj),
            )
            for block in body.h
        ]
        self.products = [block.products for block in self.blocks]

    def _logits(self, ids: Tensor, positions: Tensor, attend: Attend) -> Tensor:
        """Every block over ``ids`` (``[rows, tokens]``, at ``positions``), each attending
        through ``attend``; the logits after each row's last token."""
        rows, tokens = int(ids.shape[0]), int(ids.shape[1])
        width, heads = self.width, self.heads
        hidden = F.embedding(ids, self.tokens) + F.embedding(positions, self.places)
        hidden = hidden.view(rows * tokens, width)
        for index, block in enumerate(self.blocks):
            normed = F.layer_norm(hidden, (width,), *block.ln1, self.eps)
            qkv = block.attention(normed)
            # [query/key/value, rows, heads, tokens, dim]
            qkv = qkv.view(rows, tokens, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
            merged = attend(index, qkv[0], qkv[1], qkv[2])
            hidden = block.projection(merged).add_(hidden)
            normed = F.layer_norm(hidden, (width,), *block.ln2, self.eps)
            inner = self.activation(block.up(normed))
            hidden = block.down(inner).add_(hidden)
        last = hidden.view(rows, tokens, width)[:, -1]
        logits: Tensor = self.head(F.layer_norm(last, (width,), *self.final, self.eps))
        return logits


def gpt2_step_of(model: Any) -> GPT2Step | None:
    """A fused step for ``model`` if it is a GPT-2 this step computes exactly as
    transformers' forward does, else None."""
    config = getattr(model, "config", None)
    if config is None or type(model).__name__ != "GPT2LMHeadModel":
        return None
    unsupported = (
        getattr(config, "add_cross_attention", False)
        or getattr(config, "scale_attn_by_inverse_layer_idx", False)
        or getattr(config, "reorder_and_upcast_attn", False)
        or config.activation_function not in _ACTIVATIONS
    )
    return None if unsupported else GPT2Step(model)
