"""The fused decode step computes GPT-2's logits as transformers' forward does, step after
step of a running batch whose rows join (left-padded) and leave (columns cut); models it
cannot compute exactly keep transformers' forward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from batching.models.generation.causal import TextGenerator
from batching.models.generation.causal_batch import DecodeBatch
from batching.models.generation.fused_step import FUSED_STEP_VARIABLE, FusedStep, fused_step_of
from batching.models.generation.pieces import Joining
from tests.support.generators import gpt2_folder
from tests.support.running_batches import item

PROMPTS = ["the cat sat", "a dog", "who eats fish on the mat", "green", "the cat runs fast"]


def _generator(root: Path, activation: str = "gelu_new") -> TextGenerator:
    folder = gpt2_folder(root, positions=64, model_max_length=None)
    if activation != "gelu_new":
        config = transformers.GPT2Config.from_pretrained(folder)
        config.activation_function = activation
        config.save_pretrained(folder)
    model = TextGenerator("text-generation", folder)
    model.load("cpu")
    return model


def _both(batch: DecodeBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """This step's logits by transformers' forward and by the fused step, from the same
    cache (each writes the same new column)."""
    assert batch.mask is not None
    last = torch.tensor([[row.new_ids[-1]] for row in batch.rows])
    mask = torch.cat([batch.mask, torch.ones_like(last)], dim=1)
    end, fused = batch.window.end, batch.fused
    batch.fused = None
    reference = batch._forward(last, mask)
    batch.window.end, batch.fused = end, fused
    mine = batch._forward(last, mask)
    batch.window.end = end
    return reference, mine


@pytest.mark.parametrize("activation", ["gelu_new", "relu"])
def test_each_step_of_a_changing_batch_equals_transformers(tmp_path: Path, activation: str) -> None:
    batch = _generator(tmp_path, activation).decode_batch()
    assert isinstance(batch.fused, FusedStep)
    joins = {0: [0, 1], 3: [2], 5: [3, 4]}
    lengths = {0: 12, 1: 4, 2: 9, 3: 14, 4: 2}
    compared = 0
    for step in range(24):
        if batch.rows:
            reference, mine = _both(batch)
            assert torch.allclose(mine, reference, atol=1e-5, rtol=1e-5), step
            compared += 1
            ended = {piece.key for piece in batch.step() if piece.finish}
            batch.leave(ended)
        for key in joins.get(step, []):
            batch.join_items([Joining(key, item(PROMPTS[key], lengths[key]))])
    assert compared > 15 and not batch.rows


def test_only_what_it_computes_exactly_is_fused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generator = _generator(tmp_path)
    model: Any = generator._model
    assert isinstance(fused_step_of(model), FusedStep)
    for change in (
        {"scale_attn_by_inverse_layer_idx": True},
        {"reorder_and_upcast_attn": True},
        {"activation_function": "silu"},
    ):
        original = model.config
        model.config = type(original)(**{**original.to_dict(), **change})
        try:
            assert fused_step_of(model) is None, change
        finally:
            model.config = original
    monkeypatch.setenv(FUSED_STEP_VARIABLE, "0")
    assert fused_step_of(model) is None
    assert generator.decode_batch().fused is None


def test_the_output_layer_is_the_models_own_module(tmp_path: Path) -> None:
    """A prepacked output layer (packed_head replaces the module's forward) serves the fused
    step's logits too."""
    generator = _generator(tmp_path)
    head: Any = generator._model.get_output_embeddings()
    plain = head.forward
    calls: list[int] = []

    def counted(hidden: torch.Tensor) -> torch.Tensor:
        calls.append(int(hidden.shape[0]))
        out: torch.Tensor = plain(hidden)
        return out

    head.forward = counted
    batch = generator.decode_batch()
    batch.join_items([Joining(0, item(PROMPTS[0], 3)), Joining(1, item(PROMPTS[1], 3))])
    calls.clear()
    batch.step()
    assert calls == [2]
