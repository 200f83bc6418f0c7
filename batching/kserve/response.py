"""KServe v2 infer responses: typed tensors to a JSON header and optional binary data."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from batching.errors import InvalidRequest
from batching.kserve.tensors import LENGTH_PREFIX, InferTensor, checked_data

__all__ = ["encode_infer_response"]


def encode_infer_response(
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: list[InferTensor],
    binary_outputs: set[str],
    parameters: dict[str, object] | None = None,
) -> tuple[bytes, int | None]:
    """Encode a v2 infer response.

    Outputs named in ``binary_outputs`` follow the JSON header as little-endian buffers, in
    output order, each announced by ``parameters.binary_data_size``; the rest carry flat
    row-major ``data``. Returns the body and the value of the ``Inference-Header-Content-Length``
    header, or None when the body is pure JSON.

    :raises InvalidRequest: when a BYTES output that is not UTF-8 was asked for as JSON (the
        client can ask for it as binary instead).
    :raises ValueError: when an output's data does not match its datatype or shape, or a BYTES
        element is neither ``bytes`` nor ``str`` (a bug in the model or server, not the client).
    """
    entries: list[dict[str, object]] = []
    buffers: list[bytes] = []
    for tensor in outputs:
        data = checked_data(tensor)
        entry: dict[str, object] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": [int(dim) for dim in tensor.shape],
        }
        own = dict(tensor.parameters)
        if tensor.name in binary_outputs:
            raw = _binary_from_array(tensor.datatype, data)
            own["binary_data_size"] = len(raw)
            buffers.append(raw)
        else:
            entry["data"] = _json_from_array(tensor.name, tensor.datatype, data)
        if own:
            entry["parameters"] = own
        entries.append(entry)

    response: dict[str, object] = {"model_name": model_name}
    if model_version is not None:
        response["model_version"] = model_version
    if request_id is not None:
        response["id"] = request_id
    if parameters:
        response["parameters"] = parameters
    response["outputs"] = entries
    header = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not any(tensor.name in binary_outputs for tensor in outputs):
        return header, None
    return b"".join([header, *buffers]), len(header)


def _binary_from_array(datatype: str, data: np.ndarray) -> bytes:
    if datatype == "BYTES":
        parts: list[bytes] = []
        for item in data.reshape(-1).tolist():
            encoded = _element_bytes(item)
            parts.append(len(encoded).to_bytes(LENGTH_PREFIX, "little"))
            parts.append(encoded)
        return b"".join(parts)
    return np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<")).tobytes()


def _json_from_array(name: str, datatype: str, data: np.ndarray) -> Any:
    if datatype == "BYTES":
        strings: list[str] = []
        for item in data.reshape(-1).tolist():
            if isinstance(item, str):
                strings.append(item)
                continue
            try:
                strings.append(_element_bytes(item).decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidRequest(
                    f"output {name!r} holds bytes that are not UTF-8 and cannot be sent as "
                    "JSON; request it with binary_data"
                ) from None
        return strings
    if datatype == "FP16":
        # orjson cannot serialise float16; float32 holds every float16 exactly.
        data = data.astype(np.float32)
    # orjson serialises only native-endian C-contiguous arrays, and wants them flat here.
    return np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("=")).reshape(-1)


def _element_bytes(item: object) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    raise ValueError(f"BYTES elements must be bytes or str, got {type(item).__name__}")
