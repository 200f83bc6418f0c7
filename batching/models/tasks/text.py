"""The request parameters of the text tasks served by :mod:`batching.models.text.pipeline`.

Each is what the transformers pipeline of that task takes, under its own name, so a request's
``parameters`` mean what they mean in ``pipeline(...)(text, **parameters)``. All of them change
the post-processing alone (the forward pass is the same), so they are ``batch_neutral``:
requests that set different ones still share a batch.
"""

from __future__ import annotations

from batching.models.parameters import Param

__all__ = [
    "FEATURE_EXTRACTION",
    "FILL_MASK",
    "FUNCTION_TO_APPLY",
    "TEXT_CLASSIFICATION",
    "TOKEN_CLASSIFICATION",
    "top_k",
]

#: Embedding options (prompt_name, truncate, encoding, ...) are this task's only options.
FEATURE_EXTRACTION: tuple[Param, ...] = ()


def top_k(doc: str, default: int | None = None) -> Param:
    """A classifier's ``top_k``: how many labels to answer, best first (every classifier's
    pipeline takes it: text, image and audio)."""
    return Param("top_k", "integer", default=default, minimum=1, batch_neutral=True, doc=doc)


#: How a classifier's logits become scores, as every classifier's pipeline takes it.
FUNCTION_TO_APPLY = Param(
    "function_to_apply",
    "string",
    choices=("softmax", "sigmoid", "none"),
    batch_neutral=True,
    doc="how logits become scores (default: the model's problem type decides)",
)

TEXT_CLASSIFICATION = (
    top_k("answer the k best labels as a list (default: the best label alone, not a list)"),
    FUNCTION_TO_APPLY,
)

TOKEN_CLASSIFICATION = (
    Param(
        "aggregation_strategy",
        "string",
        default="none",
        choices=("none", "simple", "first", "average", "max"),
        batch_neutral=True,
        doc="group sub-word tokens into entities (none: one answer per token)",
    ),
    Param(
        "ignore_labels",
        "strings",
        batch_neutral=True,
        doc='labels left out of the answer (default: ["O"])',
    ),
)

FILL_MASK = (
    Param(
        "top_k",
        "integer",
        default=5,
        minimum=1,
        batch_neutral=True,
        doc="how many candidates per mask",
    ),
    Param(
        "targets",
        "strings",
        batch_neutral=True,
        doc="score only these words at the mask",
    ),
)
