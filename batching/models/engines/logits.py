"""A transformers pipeline whose logits come from the chosen engine.

The pipeline keeps its own tokenisation, batching, padding and post-processing (labels and
scores, fill-mask candidates); only its ``model`` is replaced by :class:`LogitsModel`, which
runs the engine plan and hands back the logits in the output class the real model returns.
The views are what the accuracy check compares for these tasks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers.modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    SequenceClassifierOutput,
)

from .plan import EnginePlan

__all__ = ["LogitsModel", "mask_logits", "scores"]

#: The output class the real model returns, and the field its first output goes in.
_OUTPUTS: dict[str, tuple[Any, str]] = {
    "feature-extraction": (BaseModelOutput, "last_hidden_state"),
    "text-classification": (SequenceClassifierOutput, "logits"),
    "fill-mask": (MaskedLMOutput, "logits"),
}


class LogitsModel:
    """Stands in for the pipeline's model: ``model(**inputs)`` runs ``plan``.

    :param original: the model it replaces (its config and names are kept; the model itself
        is not, so its weights are freed unless the plan runs torch).
    """

    def __init__(self, plan: EnginePlan, original: Any, task: str) -> None:
        self.plan = plan
        self.config = original.config
        self.device = original.device
        self.dtype = torch.float32
        self.base_model_prefix = getattr(original, "base_model_prefix", "model")
        self._output, self._field = _OUTPUTS[task]

    def forward(self, **inputs: Any) -> Any:
        # ONNX Runtime and OpenVINO answer in numpy; the pipeline reads tensors.
        return self._output(**{self._field: torch.as_tensor(self.plan(inputs))})

    __call__ = forward

    def can_generate(self) -> bool:
        return False

    def eval(self) -> LogitsModel:
        return self


def scores(problem: str | None, logits: torch.Tensor) -> np.ndarray:
    """The scores the text-classification pipeline reports, from ``logits``: a sigmoid for a
    single logit or multi-label model, a softmax otherwise, nothing for regression
    (``problem`` is the config's ``problem_type``)."""
    values = logits.float()
    if problem == "regression":
        result = values
    elif problem == "multi_label_classification" or values.shape[-1] == 1:
        result = torch.sigmoid(values)
    else:
        result = torch.softmax(values, dim=-1)
    return result.detach().cpu().numpy()


def mask_logits(mask_id: int, logits: torch.Tensor, input_ids: torch.Tensor) -> np.ndarray:
    """The logits at the mask tokens: one row of vocabulary logits per mask."""
    return logits[input_ids == mask_id].float().detach().cpu().numpy()
