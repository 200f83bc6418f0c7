"""The request parameters of the image tasks (:mod:`batching.models.images.classifier`,
:mod:`batching.models.images.clip`), under the names the transformers pipeline gives them."""

from __future__ import annotations

from batching.models.parameters import Param

__all__ = ["FUNCTION_TO_APPLY", "IMAGE_CLASSIFICATION", "IMAGE_TEXT_EMBEDDING", "TOP_K"]

#: The labels to return per image, best first (the pipeline's default: 5, at most the model's
#: labels). It changes post-processing only, so requests that differ in it share a batch.
TOP_K = Param(
    "top_k",
    "integer",
    default=5,
    minimum=1,
    batch_neutral=True,
    doc="labels returned per image, best first (at most the model's number of labels)",
)

#: How logits become scores, as the pipeline takes it (default: the model's problem type).
FUNCTION_TO_APPLY = Param(
    "function_to_apply",
    "string",
    choices=("softmax", "sigmoid", "none"),
    batch_neutral=True,
    doc="how logits become scores (default: the model's problem type decides)",
)

IMAGE_CLASSIFICATION = (TOP_K, FUNCTION_TO_APPLY)

#: An embedding takes no parameter: a text gets its text vector, an image its image vector.
IMAGE_TEXT_EMBEDDING: tuple[Param, ...] = ()
