"""The KServe v2 / Triton HTTP infer codec: request bodies to typed tensors and back.

Pure functions over bytes, numpy and orjson, so the HTTP layer stays thin and every protocol
rule is tested here. Covers the JSON tensor form and Triton's binary tensor data extension
(``Inference-Header-Content-Length``, ``binary_data_size``, ``binary_data``,
``binary_data_output``).

Decisions worth knowing:

- :func:`parse_infer_request` raises only :class:`~batching.errors.InvalidRequest`, whatever
  the bytes. Parsed arrays are native-endian, C-contiguous and writable (binary buffers are
  copied out of the body), so models can hand them to torch without warnings.
- BYTES tensors are numpy object arrays; elements are ``bytes`` when they came as binary data
  and ``str`` when they came as JSON strings.
- :func:`tensor_from_rows` gives every per-item scalar (a string, a JSON value, a number) the
  shape ``[n, 1]``, the shape Triton reports for a batched model with ``dims: [1]``.
- :func:`rows_from_tensor` raises :class:`~batching.errors.UnprocessableInput` for BYTES that
  are not UTF-8: the body followed the protocol, it is the text model that cannot use it.
- BF16 is rejected: numpy has no bfloat16 without an extra dependency.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from batching.errors import InvalidRequest, UnprocessableInput

__all__ = [
    "DATATYPES",
    "InferRequest",
    "InferTensor",
    "RequestedOutput",
    "datatype_of",
    "encode_infer_response",
    "parse_infer_request",
    "rows_from_tensor",
    "tensor_from_rows",
]

DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
"""Every v2 datatype this server speaks, with the numpy dtype its tensors are held in."""

_DATATYPE_BY_DTYPE: dict[np.dtype[Any], str] = {
    dtype: name for name, dtype in DATATYPES.items() if name != "BYTES"
}

# numpy refuses more dimensions than this on some versions; a bound keeps reshape from failing.
_MAX_RANK = 32
_INT64_MAX = 2**63 - 1
_LENGTH_PREFIX = 4

_JSON_TYPE_NAMES: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


@dataclass
class InferTensor:
    """One named tensor of a request or a response; ``data`` already has shape ``shape``."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestedOutput:
    """An entry of the request's ``outputs``; ``binary_data`` is None when the client left it
    unset, so the request-wide default applies."""

    name: str
    binary_data: bool | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferRequest:
    """A parsed infer request. ``outputs`` is empty when the client asked for every output."""

    id: str | None
    inputs: list[InferTensor]
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)

    def binary_output_default(self) -> bool:
        """The top-level ``binary_data_output`` parameter: whether outputs go out as binary
        unless an output says otherwise."""
        return bool(self.parameters.get("binary_data_output", False))

    def binary_output_names(self, available: Iterable[str]) -> set[str]:
        """Which outputs the response should carry as binary data.

        ``available`` are the model's output names, used when the client requested no
        outputs explicitly (then all of them are returned).
        """
        default = self.binary_output_default()
        if not self.outputs:
            return set(available) if default else set()
        return {
            out.name
            for out in self.outputs
            if (default if out.binary_data is None else out.binary_data)
        }


def datatype_of(dtype: np.dtype[Any]) -> str:
    """The v2 datatype of a numpy dtype (object arrays are BYTES).

    :raises ValueError: when the dtype has no v2 datatype (complex, datetime, ...).
    """
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return "BYTES"
    try:
        return _DATATYPE_BY_DTYPE[dtype.newbyteorder("=")]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no v2 datatype") from None


# --------------------------------------------------------------------------------------------
# Requests


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
    try:
        header = orjson.loads(header_bytes)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise InvalidRequest(f"request header must be a JSON object, got {_json_type(header)}")

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
    data = _array_from_binary(where, datatype, buffer, count)
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
    if math.prod(dim for dim in shape if dim) * max(itemsize, 1) > _INT64_MAX:
        raise InvalidRequest(f"{where}: shape {shape!r} is too large")
    return shape


def _parameters(container: dict[str, Any], where: str) -> dict[str, Any]:
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
        if "classification" in parameters:
            raise InvalidRequest(f"output {name!r}: the classification extension is not supported")
        if "shared_memory_region" in parameters:
            raise InvalidRequest(f"output {name!r}: shared memory is not supported")
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
        low, high = min(flat), max(flat)
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


def _flatten(data: list[Any]) -> list[Any]:
    if list not in set(map(type, data)):
        return data
    flat: list[Any] = []
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


def _array_from_binary(where: str, datatype: str, buffer: memoryview, count: int) -> np.ndarray:
    """A flat array of ``count`` elements from one binary tensor buffer."""
    if datatype == "BYTES":
        return _bytes_from_binary(where, buffer, count)
    dtype = DATATYPES[datatype]
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidRequest(
            f"{where}: 'binary_data_size' is {len(buffer)} bytes but {count} {datatype} "
            f"elements take {expected}"
        )
    if datatype == "BOOL":
        raw = np.frombuffer(buffer, dtype=np.uint8)
        if raw.size and raw.max() > 1:
            raise InvalidRequest(f"{where}: BOOL elements must be bytes 0 or 1")
        return raw.astype(np.bool_)
    # astype copies into a writable native-endian array that no longer pins the body.
    return np.frombuffer(buffer, dtype=dtype.newbyteorder("<")).astype(dtype)


def _bytes_from_binary(where: str, buffer: memoryview, count: int) -> np.ndarray:
    items: list[bytes] = []
    position, end = 0, len(buffer)
    while position < end:
        if len(items) == count:
            raise InvalidRequest(
                f"{where}: binary BYTES data holds more than the {count} elements of its shape"
            )
        if position + _LENGTH_PREFIX > end:
            raise InvalidRequest(
                f"{where}: binary BYTES element {len(items)} has a truncated length prefix"
            )
        length = int.from_bytes(buffer[position : position + _LENGTH_PREFIX], "little")
        position += _LENGTH_PREFIX
        if position + length > end:
            raise InvalidRequest(
                f"{where}: binary BYTES element {len(items)} claims {length} bytes but only "
                f"{end - position} remain"
            )
        items.append(bytes(buffer[position : position + length]))
        position += length
    if len(items) != count:
        raise InvalidRequest(
            f"{where}: binary BYTES data holds {len(items)} elements but the shape needs {count}"
        )
    array = np.empty(count, dtype=object)
    array[:] = items
    return array


def _json_type(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------------------------
# Responses


def encode_infer_response(
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: list[InferTensor],
    binary_outputs: set[str],
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
    entries: list[dict[str, Any]] = []
    buffers: list[bytes] = []
    for tensor in outputs:
        data = _checked_data(tensor)
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": [int(dim) for dim in tensor.shape],
        }
        parameters = dict(tensor.parameters)
        if tensor.name in binary_outputs:
            raw = _binary_from_array(tensor.datatype, data)
            parameters["binary_data_size"] = len(raw)
            buffers.append(raw)
        else:
            entry["data"] = _json_from_array(tensor.name, tensor.datatype, data)
        if parameters:
            entry["parameters"] = parameters
        entries.append(entry)

    response: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        response["model_version"] = model_version
    if request_id is not None:
        response["id"] = request_id
    response["outputs"] = entries
    header = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not any(tensor.name in binary_outputs for tensor in outputs):
        return header, None
    return b"".join([header, *buffers]), len(header)


def _checked_data(tensor: InferTensor) -> np.ndarray:
    if tensor.datatype not in DATATYPES:
        raise ValueError(f"output {tensor.name!r} has unknown datatype {tensor.datatype!r}")
    data = np.asarray(tensor.data, dtype=DATATYPES[tensor.datatype])
    if data.size != math.prod(tensor.shape):
        raise ValueError(
            f"output {tensor.name!r} has {data.size} elements but shape {tensor.shape}"
        )
    return data


def _binary_from_array(datatype: str, data: np.ndarray) -> bytes:
    if datatype == "BYTES":
        parts: list[bytes] = []
        for item in data.reshape(-1).tolist():
            encoded = _element_bytes(item)
            parts.append(len(encoded).to_bytes(_LENGTH_PREFIX, "little"))
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


def _element_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    raise ValueError(f"BYTES elements must be bytes or str, got {type(item).__name__}")


# --------------------------------------------------------------------------------------------
# Rows: the per-item view a model's predict() works with


def tensor_from_rows(name: str, rows: Sequence[Any] | np.ndarray) -> InferTensor:
    """Build an output tensor from one model output per batch item.

    - A numpy array is taken as already batched: its first dimension is the items.
    - numpy arrays or numpy scalars of one shape and dtype are stacked: ``[n, *row_shape]``
      (e.g. n float32 vectors of 384 give FP32 ``[n, 384]``).
    - Python bools give BOOL, Python ints that fit give INT64, and Python numbers give FP64.
    - ``str`` or ``bytes`` give BYTES elements as they are.
    - Anything else (dicts, lists, None, ragged arrays, mixtures) gives BYTES elements of
      UTF-8 JSON text.

    A per-item scalar always becomes shape ``[n, 1]``, as Triton reports a batched output
    with ``dims: [1]``.

    :raises ValueError: when there are no rows or an array's dtype has no v2 datatype.
    :raises TypeError: when a row is not JSON-serialisable.
    """
    if isinstance(rows, np.ndarray):
        return _numeric_tensor(name, rows)
    if len(rows) == 0:
        raise ValueError(f"output {name!r} has no rows to build a tensor from")
    kinds = set(map(type, rows))
    if all(issubclass(kind, (np.ndarray, np.generic)) for kind in kinds):
        arrays = [np.asarray(row) for row in rows]
        first = arrays[0]
        if first.dtype.kind != "O" and all(
            a.shape == first.shape and a.dtype == first.dtype for a in arrays
        ):
            return _numeric_tensor(name, np.stack(arrays))
    elif kinds == {bool}:
        return _numeric_tensor(name, np.array(rows, dtype=np.bool_))
    elif kinds <= {int, float}:
        if kinds == {int} and -(2**63) <= min(rows) and max(rows) <= _INT64_MAX:
            return _numeric_tensor(name, np.array(rows, dtype=np.int64))
        # Ints beyond INT64 land here too: orjson cannot write them as JSON either.
        with np.errstate(over="ignore"):
            values = np.array(rows, dtype=np.float64)
        if np.isfinite(values).all():
            return _numeric_tensor(name, values)
    elif kinds <= {str, bytes}:
        return _bytes_tensor(name, list(rows))
    encoded = [orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) for row in rows]
    return _bytes_tensor(name, encoded)


def _numeric_tensor(name: str, array: np.ndarray) -> InferTensor:
    if array.ndim == 0:
        raise ValueError(f"output {name!r} is a scalar; it needs a batch dimension")
    if array.ndim == 1:
        array = array.reshape(-1, 1)
    datatype = datatype_of(array.dtype)
    if datatype == "BYTES" and array.dtype.kind != "O":
        array = array.astype(object)
    array = np.ascontiguousarray(array, dtype=DATATYPES[datatype])
    return InferTensor(name, datatype, list(array.shape), array)


def _bytes_tensor(name: str, items: list[Any]) -> InferTensor:
    array = np.empty((len(items), 1), dtype=object)
    array[:, 0] = items
    return InferTensor(name, "BYTES", [len(items), 1], array)


def rows_from_tensor(tensor: InferTensor) -> list[Any]:
    """Split an input tensor into the per-item inputs a model's ``predict()`` takes.

    The first dimension is the batch. BYTES ``[n]`` or ``[n, 1]`` gives n ``str`` (binary
    elements are decoded as UTF-8); other BYTES shapes give nested lists of ``str`` per item.
    Numeric ``[n, ...]`` gives n numpy rows (views of the tensor; numpy scalars for ``[n]``).

    :raises UnprocessableInput: when the tensor has no batch dimension or BYTES data is not
        UTF-8.
    """
    data = tensor.data
    if data.ndim == 0:
        raise UnprocessableInput(
            f"input {tensor.name!r} has shape []; its first dimension must be the batch"
        )
    if tensor.datatype != "BYTES":
        return list(data)
    texts = np.empty(data.shape, dtype=object)
    flat_texts = texts.reshape(-1)
    for index, item in enumerate(data.reshape(-1).tolist()):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UnprocessableInput(
                    f"input {tensor.name!r}: element {index} is not valid UTF-8 text ({exc})"
                ) from None
        flat_texts[index] = item
    if texts.ndim == 1 or texts.shape[1:] == (1,):
        return texts.reshape(-1).tolist()
    return [row.tolist() for row in texts]
