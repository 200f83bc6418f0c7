"""The fused decode step and prefill of a Llama-family model (Llama, Mistral, Qwen2;
:mod:`.fused_step` says why and when): RMS norms, rotary positions (the model's own rotary
embedding, so every scaling it supports), grouped-query attention over the running batch's
cache, and the gated SiLU feed-forward.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .fused_forward import FusedForward
from .packed_products import Product
from .step_attention import Attend

__all__ = ["LLAMA_FAMILY", "LlamaStep", "llama_step_of"]

#: The model classes this step computes exactly as transformers does.
LLAMA_FAMILY = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"})


@dataclass(frozen=True, slots=True)
class _Layer:
    """One decoder layer's weights, as its operators take them."""

    norm1: torch.Tensor
    query: Product
    key: Product
    value: Product
    output: Product
    norm2: torch.Tensor
    gate: Product
    up: Product
    down: Product

    @property
    def products(self) -> list[Product]:
        return [self.query, self.key, self.value, self.output, self.gate, self.up, self.down]


def _linear(module: Any) -> Product:
    return Product(module.weight, module.bias, input_major=False)


class LlamaStep(FusedForward):
    """The decode step and prefill of one loaded Llama-family model (built by
    :func:`llama_step_of`)."""

    def __init__(self, model: Any) -> None:
        body = model.model
        first = body.layers[0]
        self.heads = int(model.config.num_attention_heads)
        self.kv_heads = int(model.config.num_key_value_heads)
        self.head_dim = int(first.self_attn.head_dim)
        self.scale = float(first.self_attn.scaling)
        self.eps = float(first.input_layernorm.variance_epsilon)
        self.tokens = body.embed_tokens.weight
        self.rotary = body.rotary_emb
        # The model's own function: the rotation its attention applies.
        self.rotate: Callable[..., tuple[torch.Tensor, torch.Tensor]] = sys.modules[
            type(first.self_attn).__module__
        ].apply_rotary_pos_emb
        self.final = body.norm.weight
        self.final_eps = float(body.norm.variance_epsilon)
        # The module, not its weight: its forward may be a prepacked one
        # (:func:`.packed_products.pack_output_layer`).
        self.head = model.get_output_embeddings()
        self.layers = [
            _Layer(
                layer.input_layernorm.weight,
                _linear(layer.self_attn.q_proj),
                _linear(layer.self_attn.k_proj),
                _linear(layer.self_attn.v_proj),
                _linear(layer.self_attn.o_proj),
                layer.post_attention_layernorm.weight,
                _linear(layer.mlp.gate_proj),
                _linear(layer.mlp.up_proj),
                _linear(layer.mlp.down_proj),
            )
            for layer in body.layers
        ]
        self.products = [layer.products for layer in self.layers]

    def _norm(self, hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return weight * (hidden * torch.rsqrt(variance + eps))

    def _logits(self, ids: Tensor, positions: Tensor, attend: Attend) -> Tensor:
        """Every layer over ``ids`` (``[rows, tokens]``, at ``positions``), each attending
        through ``attend``; the logits after each row's last token."""
        rows, tokens, dim = int(ids.shape[0]), int(ids.shape[1]), self.head_dim
        hidden = F.embedding(ids, self.tokens)
        cos, sin = self.rotary(hidden, positions)
        hidden = hidden.view(rows * tokens, -1)

        def heads(projected: Tensor, count: int) -> Tensor:
            return projected.view(rows, tokens, count, dim).transpose(1, 2)

        for index, layer in enumerate(self.layers):
            normed = self._norm(hidden, layer.norm1, self.eps)
            query = heads(layer.query(normed), self.heads)
            key = heads(layer.key(normed), self.kv_heads)
            value = heads(layer.value(normed), self.kv_heads)
            query, key = self.rotate(query, key, cos, sin)
            merged = attend(index, query, key, value)
            hidden = layer.output(merged).add_(hidden)
            normed = self._norm(hidden, layer.norm2, self.eps)
            inner = F.silu(layer.gate(normed)).mul_(layer.up(normed))
            hidden = layer.down(inner).add_(hidden)
        last = hidden.view(rows, tokens, -1)[:, -1]
        logits: Tensor = self.head(self._norm(last, self.final, self.final_eps))
        return logits


def llama_step_of(model: Any) -> LlamaStep | None:
    """A fused step for ``model`` if it is of the Llama family and computes as this step does
    (SiLU, one tensor-parallel slice, no per-head norms), else None."""
    config = getattr(model, "config", None)
    if config is None or type(model).__name__ not in LLAMA_FAMILY:
        return None
    layer = model.model.layers[0]
    unsupported = (
        getattr(config, "hidden_act", None) != "silu"
        or getattr(config, "pretraining_tp", 1) != 1
        or hasattr(layer.self_attn, "q_norm")
        or not hasattr(sys.modules[type(layer.self_attn).__module__], "apply_rotary_pos_emb")
    )
    return None if unsupported else LlamaStep(model)
