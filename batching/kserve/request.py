"""KServe v2 infer requests: a JSON header and optional binary tensor data to typed tensors."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from batching.documents import parse_object
from batching.errors import InvalidRequest
from batching.kserve.tensors import (
    DATATYPES,
    INT64_MAX,
    InferRequest,
    InferTensor,
    RequestedOutput,
    array_from_buffer,
    check_output_parameters,
)

__all__ = ["parse_infer_request"]

# numpy refuses more dimensions than this on some versions; a bound keeps reshape from failing.
_MAX_RANK = 32

_JSON_TYPE_NAMES: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def parse_infer_request(body: bytes, header_length: int | None) -> InferRequest:
    """Parse a v2 infer request body.

    ``header_length`` is the ``Inference-Header-Content-Length`` header, or None when the
    request had none, in which case the whole body is JSON. Binary buffers follow the JSON
    header in input order, one per input that sets ``parameters.binary_data_size``.

    :raises InvalidRequest: for anything that is not a well-formed request; nothing else.
    """
    view = memoryview(body)
    if header_length is None:
        header_bytes, binary = view, view[:0]
    else:
        if header_length < 0:
            raise InvalidRequest(
                f"Inference-Header-Content-Length must not be negative, got {header_length}"
            )
        if header_length > len(view):
            raise InvalidRequest(
                f"Inference-Header-Content-Length {header_length} exceeds the body length "
                f"{len(view)}"
            )
        header_bytes, binary = view[:header_length], view[header_length:]
    header = parse_object(
        header_bytes,
        lambda exc: InvalidRequest(f"request header is not valid JSON: {exc}"),
        lambda other: InvalidRequest(
            f"request header must be a JSON object, got {_json_type(other)}"
        ),
    )

    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"'id' must be a string, got {_json_type(request_id)}")
    parameters = _parameters(header, "the request")
    binary_default = parameters.get("binary_data_output")
    if binary_default is not None and not isinstance(binary_default, bool):
        raise InvalidRequest(
            f"parameter 'binary_data_output' must be a boolean, got {_json_type(binary_default)}"
        )

    if "inputs" not in header:
        raise InvalidRequest("request has no 'inputs'")
    raw_inputs = header["inputs"]
    if not isinstance(raw_inputs, list):
        raise InvalidRequest(f"'inputs' must be an array, got {_json_type(raw_inputs)}")
    if not raw_inputs:
        raise InvalidRequest("'inputs' must not be empty")

    inputs: list[InferTensor] = []
    seen: set[str] = set()
    offset = 0
    for index, raw in enumerate(raw_inputs):
        tensor, used = _parse_input(index, raw, binary, offset, header_length is not None)
        if tensor.name in seen:
            raise InvalidRequest(f"input {tensor.name!r} appears more than once")
        seen.add(tensor.name)
        inputs.append(tensor)
        offset += used
    if offset != len(binary):
        raise InvalidRequest(
            f"{len(binary) - offset} bytes of binary data follow the header but no input "
            "claims them"
        )

    outputs = _parse_outputs(header.get("outputs"))
    return InferRequest(id=request_id, inputs=inputs, outputs=outputs, parameters=parameters)


def _parse_input(
    index: int, raw: Any, binary: memoryview, offset: int, has_binary_section: bool
) -> tuple[InferTensor, int]:
    """One ``$request_input``, and how many binary bytes it consumed."""
    if not isinstance(raw, dict):
        raise InvalidRequest(f"inputs[{index}] must be an object, got {_json_type(raw)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"inputs[{index}] needs a non-empty string 'name'")
    where = f"input {name!r}"

    datatype = raw.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidRequest(f"{where} needs a string 'datatype'")
    if datatype == "BF16":
        raise InvalidRequest(f"{where}: datatype BF16 is not supported by this server")
    if datatype not in DATATYPES:
        raise InvalidRequest(
            f"{where}: unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}"
        )

    shape = _parse_shape(where, raw.get("shape"), DATATYPES[datatype].itemsize)
    count = math.prod(shape)
    parameters = _parameters(raw, where)
    if "shared_memory_region" in parameters:
        raise InvalidRequest(f"{where}: shared memory is not supported by this server")

    size = parameters.get("binary_data_size")
    if size is None:
        if "data" not in raw:
            raise InvalidRequest(f"{where} has neither 'data' nor 'binary_data_size'")
        data = _array_from_json(where, datatype, raw["data"], count)
        return InferTensor(name, datatype, shape, data.reshape(shape), parameters), 0

    if "data" in raw:
        raise InvalidRequest(f"{where} has both 'data' and 'binary_data_size'")
    if type(size) is not int or size < 0:
        raise InvalidRequest(
            f"{where}: 'binary_data_size' must be a non-negative integer, got {size!r}"
        )
    if not has_binary_section:
        raise InvalidRequest(
            f"{where} sets 'binary_data_size' but the request has no "
            "Inference-Header-Content-Length header"
        )
    if offset + size > len(binary):
        raise InvalidRequest(
            f"{where}: 'binary_data_size' {size} runs past the end of the body "
            f"({len(binary) - offset} bytes left)"
        )
    buffer = binary[offset : offset + size]
    data = array_from_buffer(
        where, datatype, buffer, count, kind="binary", size_field="'binary_data_size' is"
    )
    return InferTensor(name, datatype, shape, data.reshape(shape), parameters), size


def _parse_shape(where: str, shape: Any, itemsize: int) -> list[int]:
    if not isinstance(shape, list):
        raise InvalidRequest(f"{where} needs 'shape' as an array of integers")
    if len(shape) > _MAX_RANK:
        raise InvalidRequest(f"{where}: shape has {len(shape)} dimensions, at most {_MAX_RANK}")
    for dim in shape:
        # bool is an int subclass, but `true` is not a dimension.
        if type(dim) is not int:
            raise InvalidRequest(f"{where}: shape {shape!r} must contain only integers")
        if dim < 0:
            raise InvalidRequest(f"{where}: shape {shape!r} has a negative dimension")
    # A zero dimension makes the element count 0, yet numpy still refuses shapes whose other
    # dimensions overflow, so bound them even for empty tensors.
    if math.prod(dim for dim in shape if dim) * max(itemsize, 1) > INT64_MAX:
        raise InvalidRequest(f"{where}: shape {shape!r} is too large")
    return shape


def _parameters(container: Mapping[str, object], where: str) -> dict[str, object]:
    parameters = container.get("parameters", {})
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidRequest(
            f"'parameters' of {where} must be an object, got {_json_type(parameters)}"
        )
    return parameters


def _parse_outputs(raw_outputs: Any) -> list[RequestedOutput]:
    if raw_outputs is None:
        return []
    if not isinstance(raw_outputs, list):
        raise InvalidRequest(f"'outputs' must be an array, got {_json_type(raw_outputs)}")
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_outputs):
        if not isinstance(raw, dict):
            raise InvalidRequest(f"outputs[{index}] must be an object, got {_json_type(raw)}")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"outputs[{index}] needs a non-empty string 'name'")
        if name in seen:
            raise InvalidRequest(f"output {name!r} is requested more than once")
        seen.add(name)
        parameters = _parameters(raw, f"output {name!r}")
        binary_data = parameters.get("binary_data")
        if binary_data is not None and not isinstance(binary_data, bool):
            raise InvalidRequest(
                f"output {name!r}: 'binary_data' must be a boolean, got {_json_type(binary_data)}"
            )
        check_output_parameters(name, parameters)
        outputs.append(RequestedOutput(name, binary_data, parameters))
    return outputs


def _array_from_json(where: str, datatype: str, data: Any, count: int) -> np.ndarray:
    """A flat array of ``count`` elements from JSON ``data``, flat or nested row-major."""
    if not isinstance(data, list):
        raise InvalidRequest(f"{where}: 'data' must be an array, got {_json_type(data)}")
    flat = _flatten(data)
    if len(flat) != count:
        raise InvalidRequest(
            f"{where}: 'data' has {len(flat)} elements but the shape needs {count}"
        )
    dtype = DATATYPES[datatype]
    if datatype == "BYTES":
        allowed: frozenset[type] = frozenset({str})
        expected = "strings"
    elif datatype == "BOOL":
        allowed = frozenset({bool})
        expected = "booleans"
    elif dtype.kind in "iu":
        allowed = frozenset({int})
        expected = "integers"
    else:
        allowed = frozenset({int, float})
        expected = "numbers"
    # Exact types, not isinstance: JSON `true` arrives as bool, which is an int subclass.
    if not set(map(type, flat)) <= allowed:
        position, bad = next((i, v) for i, v in enumerate(flat) if type(v) not in allowed)
        raise InvalidRequest(
            f"{where}: element {position} is {_json_type(bad)}, but {datatype} data must be "
            f"{expected}"
        )

    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = flat
        return array
    if dtype.kind in "iu" and flat:
        info = np.iinfo(dtype)
        ints = [value for value in flat if isinstance(value, int)]
        low, high = min(ints), max(ints)
        if low < info.min or high > info.max:
            raise InvalidRequest(
                f"{where}: values must lie in [{info.min}, {info.max}] for {datatype}, "
                f"got {low if low < info.min else high}"
            )
    if dtype.kind == "f":
        # Casting rounds out-of-range values to infinity, which a client never sent.
        with np.errstate(over="ignore", invalid="ignore"):
            array = np.array(flat, dtype=dtype)
        if not np.isfinite(array).all():
            raise InvalidRequest(f"{where}: a value is out of range for {datatype}")
        return array
    return np.array(flat, dtype=dtype)


def _flatten(data: list[object]) -> list[object]:
    if list not in set(map(type, data)):
        return data
    flat: list[object] = []
    # An explicit stack, since nesting depth is the client's to choose.
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _json_type(value: object) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
