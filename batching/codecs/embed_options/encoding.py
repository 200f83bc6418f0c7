"""Encoding an embedding answer: the model's outputs as the vectors the request asked for
(shortened to the door's ``dimensions``, or the integer vectors of a compact encoding), and
each vector as the answer carries it (numbers, or base64 of its bytes)."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

import numpy as np

from batching.errors import InferenceFailed

from .planning import EmbedPlan, check_dimensions

__all__ = ["encode_vector", "vectors_of"]


def vectors_of(outputs: Iterable[object], plan: EmbedPlan, model: str) -> list[np.ndarray]:
    """The model's outputs as 1-D vectors: float32 shortened to the door's ``dimensions``
    (and re-normalised for unit vectors), or the int8/uint8 vectors of a compact encoding.

    :raises InferenceFailed: an output is not one vector of the asked type.
    :raises OptionError: ``dimensions`` cannot be honoured (the width the metadata did not
        say).
    """
    compact = plan.options.encoding != "float"
    wanted = {"int8": np.int8, "binary": np.int8, "uint8": np.uint8, "ubinary": np.uint8}
    vectors = []
    for index, output in enumerate(outputs):
        if compact:
            vector = np.asarray(output)
            dtype = np.dtype(wanted[plan.options.encoding])
            if vector.dtype != dtype:
                raise InferenceFailed(
                    f"model {model!r} returned {vector.dtype} for input {index}, not the "
                    f"{dtype} of encoding {plan.options.encoding!r}"
                )
        else:
            vector = np.asarray(output, dtype=np.float32)
        if vector.ndim != 1:
            raise InferenceFailed(
                f"model {model!r} returned an output of shape {list(vector.shape)} for "
                f"input {index}, not one embedding vector"
            )
        dimensions = plan.door_dimensions
        if dimensions is not None and dimensions != vector.shape[0]:
            check_dimensions(dimensions, int(vector.shape[0]), plan.normalized, model)
            vector = vector[:dimensions]
            norm = float(np.linalg.norm(vector))
            if norm > 0:
                vector = (vector / norm).astype(np.float32)
        vectors.append(np.ascontiguousarray(vector))
    return vectors


def encode_vector(vector: np.ndarray, as_base64: bool) -> Any:
    """One vector for a JSON answer: a numpy array (orjson writes it as a list) or the
    base64 of its little-endian bytes (float32, or the int8/uint8 bytes as they are)."""
    if not as_base64:
        return vector
    if vector.dtype.kind == "f":
        vector = vector.astype("<f4", copy=False)
    return base64.b64encode(vector.tobytes()).decode("ascii")
