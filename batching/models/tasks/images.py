"""The request parameters of the image tasks (:mod:`batching.models.images.classifier`,
:mod:`batching.models.images.clip`), under the names the transformers pipeline gives them."""

from __future__ import annotations

from batching.models.parameters import Param

from .text import FUNCTION_TO_APPLY, top_k

__all__ = ["FUNCTION_TO_APPLY", "IMAGE_CLASSIFICATION", "IMAGE_TEXT_EMBEDDING", "TOP_K"]

#: The labels to return per image, best first (the pipeline's default: 5, at most the model's
#: labels). It changes post-processing only, so requests that differ in it share a batch.
TOP_K = top_k("labels returned per image, best first (at most the model's number of labels)", 5)

IMAGE_CLASSIFICATION = (TOP_K, FUNCTION_TO_APPLY)

#: An embedding takes no parameter: a text gets its text vector, an image its image vector.
IMAGE_TEXT_EMBEDDING: tuple[Param, ...] = ()
