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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from batching.errors import InvalidRequest, UnprocessableInput
from batching.models.items import Item

__all__ = [
    "DATATYPES",
    "INT64_MAX",
    "LENGTH_PREFIX",
    "array_from_buffer",
    "check_output_parameters",
    "checked_data",
    "InferRequest",
    "InferTensor",
    "RequestedOutput",
    "datatype_of",
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

#: Bytes of the little-endian length before each element of a binary BYTES tensor.
LENGTH_PREFIX = 4
INT64_MAX = 2**63 - 1


@dataclass
class InferTensor:
    """One named tensor of a request or a response; ``data`` already has shape ``shape``."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray
    parameters: dict[str, object] = field(default_factory=dict)


@dataclass
class RequestedOutput:
    """An entry of the request's ``outputs``; ``binary_data`` is None when the client left it
    unset, so the request-wide default applies."""

    name: str
    binary_data: bool | None = None
    parameters: dict[str, object] = field(default_factory=dict)


@dataclass
class InferRequest:
    """A parsed infer request. ``outputs`` is empty when the client asked for every output."""

    id: str | None
    inputs: list[InferTensor]
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, object] = field(default_factory=dict)

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


def tensor_from_rows(name: str, rows: Sequence[object] | np.ndarray) -> InferTensor:
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
        numbers = [row for row in rows if isinstance(row, int | float)]
        if kinds == {int} and -(2**63) <= min(numbers) and max(numbers) <= INT64_MAX:
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


def _bytes_tensor(name: str, items: Sequence[object]) -> InferTensor:
    array = np.empty((len(items), 1), dtype=object)
    array[:, 0] = items
    return InferTensor(name, "BYTES", [len(items), 1], array)


def checked_data(tensor: InferTensor) -> np.ndarray:
    """An output tensor's data in its datatype's dtype, checked against its shape.

    :raises ValueError: an unknown datatype, or data that does not fill the shape.
    """
    if tensor.datatype not in DATATYPES:
        raise ValueError(f"output {tensor.name!r} has unknown datatype {tensor.datatype!r}")
    data = np.asarray(tensor.data, dtype=DATATYPES[tensor.datatype])
    if data.size != math.prod(tensor.shape):
        raise ValueError(
            f"output {tensor.name!r} has {data.size} elements but shape {tensor.shape}"
        )
    return data


def check_output_parameters(name: str, parameters: Mapping[str, object]) -> None:
    """Refuse what a requested output asks that this server does not do.

    :raises InvalidRequest: Triton's classification extension, or shared memory.
    """
    if "classification" in parameters:
        raise InvalidRequest(f"output {name!r}: the classification extension is not supported")
    if "shared_memory_region" in parameters:
        raise InvalidRequest(f"output {name!r}: shared memory is not supported")


def rows_from_tensor(tensor: InferTensor) -> list[Item]:
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
    # Annotated: numpy's stubs type empty() of an unknown-rank shape as rank 0.
    texts: np.ndarray = np.empty(data.shape, dtype=object)
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


def array_from_buffer(
    where: str, datatype: str, buffer: memoryview, count: int, *, kind: str, size_field: str
) -> np.ndarray:
    """A flat array of ``count`` elements from one tensor's bytes: little-endian elements, or
    for BYTES a 4-byte little-endian length before each element. HTTP's binary extension and
    gRPC's ``raw_input_contents`` share the layout; ``kind`` ("binary", "raw") and
    ``size_field`` (what told the size) name the source in messages.

    :raises InvalidRequest: when the bytes do not hold ``count`` elements of ``datatype``.
    """
    if datatype == "BYTES":
        return _bytes_from_buffer(where, buffer, count, kind)
    dtype = DATATYPES[datatype]
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidRequest(
            f"{where}: {size_field} {len(buffer)} bytes but {count} {datatype} "
            f"elements take {expected}"
        )
    if datatype == "BOOL":
        raw = np.frombuffer(buffer, dtype=np.uint8)
        if raw.size and raw.max() > 1:
            raise InvalidRequest(f"{where}: BOOL elements must be bytes 0 or 1")
        return raw.astype(np.bool_)
    # astype copies into a writable native-endian array that no longer pins the body.
    return np.frombuffer(buffer, dtype=dtype.newbyteorder("<")).astype(dtype)


def _bytes_from_buffer(where: str, buffer: memoryview, count: int, kind: str) -> np.ndarray:
    items: list[bytes] = []
    position, end = 0, len(buffer)
    while position < end:
        if len(items) == count:
            raise InvalidRequest(
                f"{where}: {kind} BYTES data holds more than the {count} elements of its shape"
            )
        if position + LENGTH_PREFIX > end:
            raise InvalidRequest(
                f"{where}: {kind} BYTES element {len(items)} has a truncated length prefix"
            )
        length = int.from_bytes(buffer[position : position + LENGTH_PREFIX], "little")
        position += LENGTH_PREFIX
        if position + length > end:
            raise InvalidRequest(
                f"{where}: {kind} BYTES element {len(items)} claims {length} bytes but only "
                f"{end - position} remain"
            )
        items.append(bytes(buffer[position : position + length]))
        position += length
    if len(items) != count:
        raise InvalidRequest(
            f"{where}: {kind} BYTES data holds {len(items)} elements but the shape needs {count}"
        )
    array = np.empty(count, dtype=object)
    array[:] = items
    return array
