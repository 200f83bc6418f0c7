"""The request parameters of zero-shot-classification (:mod:`batching.models.text.zero_shot`).

They are the pipeline's own: ``pipeline("zero-shot-classification")(text, candidate_labels=...,
hypothesis_template=..., multi_label=...)``. Every one is batch-neutral: a request becomes one
unit of batching per (text, label) pair before it is queued, and the pairs of any requests
share batches.
"""

from __future__ import annotations

from batching.models.parameters import Param

__all__ = ["DEFAULT_TEMPLATE", "ZERO_SHOT_CLASSIFICATION"]

#: The pipeline's own default.
DEFAULT_TEMPLATE = "This example is {}."

ZERO_SHOT_CLASSIFICATION = (
    Param(
        "candidate_labels",
        "strings",
        required=True,
        batch_neutral=True,
        doc="the labels to score each text against (a string is one label)",
    ),
    Param(
        "hypothesis_template",
        "string",
        default=DEFAULT_TEMPLATE,
        batch_neutral=True,
        doc="the hypothesis each label is put in; it must hold {} where the label goes",
    ),
    Param(
        "multi_label",
        "boolean",
        default=False,
        batch_neutral=True,
        doc="score each label on its own (entailment against contradiction) instead of a "
        "softmax over the labels",
    ),
)
