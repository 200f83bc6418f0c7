"""Sparse vectors as KServe v2 tensors: a model that returns SPLADE vectors answers with two
outputs, its indices (INT64) and its values (FP32), each ``[n, k]``: row ``i`` holds item
``i``'s non-zero entries (indices ascending), then index -1 and value 0 up to ``k``, the most
non-zeros of any item in the request (at least 1). ``indices[i][indices[i] >= 0]`` and
``values[i][indices[i] >= 0]`` are item ``i``'s entries.

The options of ``/embed_sparse`` (``prompt_name``, ``input_type``, ``truncation_direction``,
``truncate``) are request parameters here, with the same meaning and the same 400s and 413."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from batching.codecs.plain import check_texts
from batching.codecs.sparse import options_request, serves_sparse, sparse_items
from batching.models.items import Item, SparseVector
from batching.runtime.deployment import Deployment

from .tensors import InferTensor

__all__ = ["PAD_INDEX", "is_sparse", "sparse_items_of", "sparse_tensors"]

#: The index of the padding past a row's non-zeros (its value is 0).
PAD_INDEX = -1


def is_sparse(outputs: Any) -> bool:
    """Whether a model's outputs are sparse vectors, one per item."""
    return (
        isinstance(outputs, list | tuple)
        and len(outputs) > 0
        and all(isinstance(output, SparseVector) for output in outputs)
    )


def sparse_tensors(names: Sequence[str], vectors: Sequence[SparseVector]) -> list[InferTensor]:
    """The indices and values tensors of ``vectors``, under the model's first two output
    names (``indices`` and ``values`` when it declares fewer)."""
    index_name, value_name = (names[0], names[1]) if len(names) >= 2 else ("indices", "values")
    width = max(1, max(len(vector.indices) for vector in vectors))
    indices = np.full((len(vectors), width), PAD_INDEX, dtype=np.int64)
    values = np.zeros((len(vectors), width), dtype=np.float32)
    for row, vector in enumerate(vectors):
        count = len(vector.indices)
        indices[row, :count] = vector.indices
        values[row, :count] = vector.values
    shape = [len(vectors), width]
    return [
        InferTensor(index_name, "INT64", list(shape), indices),
        InferTensor(value_name, "FP32", list(shape), values),
    ]


def sparse_items_of(
    deployment: Deployment, options: Mapping[str, object], texts: Sequence[Item]
) -> Sequence[Item]:
    """The items of ``texts`` for a sparse model, with the options its request's parameters
    set (``options``: the parameters other than Triton's own); ``texts`` as they are for any
    other model.

    :raises InvalidRequest: an option of the wrong type or value, an unknown prompt name.
    """
    if not serves_sparse(deployment.metadata):
        return texts
    request = options_request(check_texts(texts), options, where="the request's parameters")
    return sparse_items(request, deployment.metadata)
