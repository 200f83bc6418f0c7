"""KServe v2 tensors over gRPC: a ``ModelInferRequest`` to an :class:`InferRequest`, and
response tensors to a ``ModelInferResponse``.

Pure functions over the protobuf messages generated in ``tritonclient.grpc`` and numpy, so every
protocol rule is tested without a server. What the tensors mean for a model is
:mod:`batching.kserve.infer`'s business, as it is for HTTP.

Decisions worth knowing:

- :func:`parse_infer_request` raises only :class:`~batching.errors.InvalidRequest`, whatever
  the message. Input data comes either in ``raw_input_contents`` (one entry per input, in input
  order: little-endian elements; BYTES as a 4-byte little-endian length before each element, as
  in HTTP's binary extension) or in each input's typed ``contents``, as Triton accepts it.
- Typed contents must sit in the field of the input's datatype (``fp32_contents`` for FP32,
  ``int_contents`` for INT8/16/32, ...); FP16 has no typed field and must come raw.
- Request parameters keep whatever value type they were sent with; what they mean (Triton's,
  embedding options, or a 400) is :mod:`batching.kserve.infer`'s business.
- Outputs go back in ``raw_output_contents``, which is what tritonclient reads fastest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
from tritonclient.grpc import service_pb2

from batching.errors import InvalidRequest, PayloadTooLarge
from batching.kserve.tensors import (
    DATATYPES,
    INT64_MAX,
    LENGTH_PREFIX,
    InferRequest,
    InferTensor,
    RequestedOutput,
    array_from_buffer,
    check_output_parameters,
    checked_data,
)

__all__ = [
    "Choice",
    "check_item_count",
    "choice_value",
    "encode_infer_response",
    "parameters_of",
    "parse_infer_request",
]

#: The typed ``contents`` field each datatype's elements go in (Triton's rule).
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

# numpy refuses more dimensions than this on some versions; a bound keeps reshape from failing.
_MAX_RANK = 32


class Choice(Protocol):
    """A protobuf message whose value is one of several fields (``InferParameter``, a log
    setting's value): its ``parameter_choice``."""

    def WhichOneof(self, group: str, /) -> str | None: ...


def choice_value(value: Choice) -> object:
    """The plain value of ``value``'s ``parameter_choice``; None when none is set."""
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


def parameters_of(parameters: Mapping[str, Choice]) -> dict[str, object]:
    """A protobuf ``map<string, InferParameter>`` as a dict of plain values."""
    return {key: choice_value(parameter) for key, parameter in parameters.items()}


def check_item_count(request: Any, cap: int) -> None:
    """Refuse a ``ModelInferRequest`` that declares more than ``cap`` items, from its shapes
    alone, before any element is decoded: the first dimension of every input is its item
    count, and a BYTES input may hold no more than ``cap`` elements in all (each is a text,
    decoded one by one; numeric data is decoded at once, whatever its size).

    :raises PayloadTooLarge: with the message the batcher gives a request over the cap.
    """
    for tensor in request.inputs:
        shape = [int(dim) for dim in tensor.shape]
        rows = shape[0] if shape else 1
        elements = math.prod(shape) if str(tensor.datatype) == "BYTES" else rows
        count = max(rows, elements)
        if count > cap:
            raise PayloadTooLarge(
                f"a request may carry at most {cap} items, this one has {count}"
                + ("" if rows == count else f" (elements of input {str(tensor.name)!r})")
            )


def parse_infer_request(request: Any) -> InferRequest:
    """The tensors, requested outputs and parameters of a ``ModelInferRequest``.

    :raises InvalidRequest: for anything that is not a well-formed request; nothing else.
    """
    if not request.inputs:
        raise InvalidRequest("the request has no inputs")
    raw_contents = request.raw_input_contents
    if raw_contents and len(raw_contents) != len(request.inputs):
        raise InvalidRequest(
            f"raw_input_contents has {len(raw_contents)} entries for {len(request.inputs)} "
            "inputs; give one per input, in input order, or use each input's contents"
        )
    inputs: list[InferTensor] = []
    seen: set[str] = set()
    for index, tensor in enumerate(request.inputs):
        raw = raw_contents[index] if raw_contents else None
        parsed = _parse_input(index, tensor, raw)
        if parsed.name in seen:
            raise InvalidRequest(f"input {parsed.name!r} appears more than once")
        seen.add(parsed.name)
        inputs.append(parsed)
    return InferRequest(
        id=request.id or None,
        inputs=inputs,
        outputs=_parse_outputs(request.outputs),
        parameters=parameters_of(request.parameters),
    )


def _parse_input(index: int, tensor: Any, raw: bytes | None) -> InferTensor:
    name = str(tensor.name)
    if not name:
        raise InvalidRequest(f"inputs[{index}] needs a name")
    where = f"input {name!r}"
    datatype = str(tensor.datatype)
    if datatype == "BF16":
        raise InvalidRequest(f"{where}: datatype BF16 is not supported by this server")
    if datatype not in DATATYPES:
        raise InvalidRequest(
            f"{where}: unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}"
        )
    shape = _parse_shape(where, [int(dim) for dim in tensor.shape], DATATYPES[datatype].itemsize)
    count = math.prod(shape)
    parameters = parameters_of(tensor.parameters)
    if "shared_memory_region" in parameters:
        raise InvalidRequest(f"{where}: shared memory is not supported by this server")
    typed = tensor.contents.ListFields() if tensor.HasField("contents") else []
    if raw is not None:
        if typed:
            raise InvalidRequest(f"{where} has both contents and raw_input_contents")
        data = _from_raw(where, datatype, raw, count)
    else:
        data = _array_from_contents(where, datatype, typed, count)
    return InferTensor(name, datatype, shape, data.reshape(shape), parameters)


def _parse_shape(where: str, shape: list[int], itemsize: int) -> list[int]:
    if len(shape) > _MAX_RANK:
        raise InvalidRequest(f"{where}: shape has {len(shape)} dimensions, at most {_MAX_RANK}")
    if any(dim < 0 for dim in shape):
        raise InvalidRequest(f"{where}: shape {shape} has a negative dimension")
    if math.prod(dim for dim in shape if dim) * max(itemsize, 1) > INT64_MAX:
        raise InvalidRequest(f"{where}: shape {shape} is too large")
    return shape


def _parse_outputs(requested: Any) -> list[RequestedOutput]:
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for index, output in enumerate(requested):
        name = str(output.name)
        if not name:
            raise InvalidRequest(f"outputs[{index}] needs a name")
        if name in seen:
            raise InvalidRequest(f"output {name!r} is requested more than once")
        seen.add(name)
        parameters = parameters_of(output.parameters)
        check_output_parameters(name, parameters)
        outputs.append(RequestedOutput(name, None, parameters))
    return outputs


def _array_from_contents(
    where: str, datatype: str, typed: list[tuple[Any, Any]], count: int
) -> np.ndarray:
    """A flat array of ``count`` elements from an input's typed ``contents``."""
    field = CONTENTS_FIELD.get(datatype)
    if not typed:
        if count == 0:
            return np.empty(0, dtype=DATATYPES[datatype])
        raise InvalidRequest(
            f"{where} has no data: send it in raw_input_contents or in contents"
            + (f".{field}" if field else "")
        )
    if field is None:
        raise InvalidRequest(f"{where}: {datatype} data has no typed contents; send it raw")
    wrong = [descriptor.name for descriptor, _ in typed if descriptor.name != field]
    if wrong:
        raise InvalidRequest(f"{where}: {datatype} data goes in contents.{field}, not {wrong[0]}")
    values = list(typed[0][1])
    if len(values) != count:
        raise InvalidRequest(
            f"{where}: contents.{field} has {len(values)} elements but the shape needs {count}"
        )
    dtype = DATATYPES[datatype]
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = values
        return array
    if dtype.kind in "iu" and dtype.itemsize < 8:
        # int_contents and uint_contents hold 32 bits; narrower types must fit.
        info = np.iinfo(dtype)
        low, high = min(values), max(values)
        if low < info.min or high > info.max:
            raise InvalidRequest(
                f"{where}: values must lie in [{info.min}, {info.max}] for {datatype}, "
                f"got {low if low < info.min else high}"
            )
    return np.array(values, dtype=dtype)


def _from_raw(where: str, datatype: str, raw: bytes, count: int) -> np.ndarray:
    """A flat array of ``count`` elements from one ``raw_input_contents`` entry."""
    return array_from_buffer(
        where, datatype, memoryview(raw), count, kind="raw", size_field="raw_input_contents holds"
    )


def encode_infer_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: list[InferTensor],
    parameters: Mapping[str, object] | None = None,
) -> Any:
    """A ``ModelInferResponse`` carrying ``outputs`` in ``raw_output_contents``, and
    ``parameters`` (bool, int or str values) in its parameters.

    :raises ValueError: when an output's data does not match its datatype or shape, or a BYTES
        element is neither ``bytes`` nor ``str`` (a bug in the model or server, not the client).
    """
    response = service_pb2.ModelInferResponse(
        model_name=model_name, model_version=model_version, id=request_id or ""
    )
    for tensor in outputs:
        data = checked_data(tensor)
        entry = response.outputs.add(name=tensor.name, datatype=tensor.datatype)
        entry.shape.extend(int(dim) for dim in tensor.shape)
        response.raw_output_contents.append(_raw_from_array(tensor.datatype, data))
    for key, value in (parameters or {}).items():
        parameter = response.parameters[key]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            parameter.int64_param = value
        else:
            parameter.string_param = str(value)
    return response


def _raw_from_array(datatype: str, data: np.ndarray) -> bytes:
    if datatype != "BYTES":
        return np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<")).tobytes()
    parts: list[bytes] = []
    for item in data.reshape(-1).tolist():
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, bytes):
            raise ValueError(f"BYTES elements must be bytes or str, got {type(item).__name__}")
        parts.append(len(item).to_bytes(LENGTH_PREFIX, "little"))
        parts.append(item)
    return b"".join(parts)
