"""Media inputs of a KServe v2 request (an ``image`` or ``audio`` input, as the model's
metadata declares with ``"content"``): one BYTES element per item, raw bytes where the
transport carries them (HTTP's binary extension, gRPC's ``raw_input_contents`` or
``bytes_contents``) and base64 text in HTTP's JSON form. Never a path or a URL
(:mod:`batching.codecs.media`)."""

from __future__ import annotations

from batching.codecs.media import media_bytes
from batching.errors import InvalidRequest

from .tensors import InferTensor

__all__ = ["media_rows"]


def media_rows(tensor: InferTensor, kind: str) -> list[bytes]:
    """The items of a media input tensor: shape ``[n]`` or ``[n, 1]`` of BYTES, each element
    one item's bytes.

    :raises InvalidRequest: another datatype or shape, or an element that is neither bytes nor
        base64 text.
    """
    if tensor.datatype != "BYTES":
        raise InvalidRequest(
            f"input {tensor.name!r} takes BYTES ({kind} bytes, one element per item), "
            f"got {tensor.datatype}"
        )
    data = tensor.data
    if data.ndim not in (1, 2) or (data.ndim == 2 and data.shape[1] != 1):
        raise InvalidRequest(
            f"input {tensor.name!r} has shape {list(data.shape)}; send one {kind} per item, "
            "shape [n] or [n, 1]"
        )
    rows = data.reshape(-1).tolist()
    if not rows:
        raise InvalidRequest(f"input {tensor.name!r} has no items")
    return [
        media_bytes(row, kind, f"input {tensor.name!r}: item {index}")
        for index, row in enumerate(rows)
    ]
