"""Tests for the v2 codec, using NVIDIA's own client encoders and decoders as the reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching.errors import InvalidRequest, UnprocessableInput
from batching.kserve.request import parse_infer_request
from batching.kserve.response import encode_infer_response
from batching.kserve.tensors import (
    DATATYPES,
    InferRequest,
    InferTensor,
    RequestedOutput,
    datatype_of,
    rows_from_tensor,
    tensor_from_rows,
)

# One sample per datatype, holding each type's extremes where it has them.
SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 1, 255]], dtype=np.uint8),
    "UINT16": np.array([[0, 7, 65535]], dtype=np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1]], dtype=np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127]], dtype=np.int8),
    "INT16": np.array([[-(2**15), 0, 2**15 - 1]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1]], dtype=np.int64),
    "FP16": np.array([[-1.5, 0.0, 65504.0], [0.25, 3.0, -2.0]], dtype=np.float16),
    "FP32": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "FP64": np.array([[1e-300, -2.5, 1e300]], dtype=np.float64),
    "BYTES": np.array([[b"hello"], [b""], ["h\u00e9llo \u2603".encode()]], dtype=object),
}


def client_request(
    arrays: dict[str, np.ndarray],
    binary: bool,
    outputs: list[triton.InferRequestedOutput] | None = None,
    request_id: str = "",
    parameters: dict[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """The exact body and header length tritonclient would send for these inputs."""
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == object else triton_dtype(array)
        tensor = triton.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    return triton.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id=request_id, parameters=parameters
    )


def triton_dtype(array: np.ndarray) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return str(np_to_triton_dtype(array.dtype))


def raw_body(header: Any, *buffers: bytes) -> tuple[bytes, int]:
    encoded = orjson.dumps(header)
    return encoded + b"".join(buffers), len(encoded)


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape
    if expected.dtype == object:
        decode = np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else v, otypes=[object])
        assert decode(actual).tolist() == decode(expected).tolist()
    else:
        assert actual.dtype == expected.dtype
        np.testing.assert_array_equal(actual, expected)


# --------------------------------------------------------------------------------------------
# Requests built by tritonclient


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_parse_every_datatype_from_tritonclient(datatype: str, binary: bool) -> None:
    sample = SAMPLES[datatype]
    body, header_length = client_request({"IN": sample}, binary)
    assert (header_length is not None) == binary

    request = parse_infer_request(body, header_length)

    (tensor,) = request.inputs
    assert tensor.name == "IN"
    assert tensor.datatype == datatype
    assert tensor.shape == list(sample.shape)
    assert tensor.data.dtype == DATATYPES[datatype]
    assert_same(tensor.data, sample)
    if datatype == "BYTES":
        # Binary elements stay bytes; JSON strings stay str.
        assert {type(v) for v in tensor.data.flat} == ({bytes} if binary else {str})


def test_parse_mixed_binary_and_json_inputs_in_order() -> None:
    first = triton.InferInput("A", [2, 3], "FP32").set_data_from_numpy(
        np.ones((2, 3), dtype=np.float32), binary_data=True
    )
    second = triton.InferInput("B", [2], "INT64").set_data_from_numpy(
        np.array([4, 5]), binary_data=False
    )
    third = triton.InferInput("C", [2, 1], "BYTES").set_data_from_numpy(
        np.array([[b"\x00\xff"], [b"q"]], dtype=object), binary_data=True
    )
    outputs = [
        triton.InferRequestedOutput("X", binary_data=True),
        triton.InferRequestedOutput("Y", binary_data=False),
    ]
    body, header_length = triton.InferenceServerClient.generate_request_body(
        [first, second, third], outputs=outputs, request_id="req-7", parameters={"k": 3}
    )

    request = parse_infer_request(body, header_length)

    assert request.id == "req-7"
    assert request.parameters == {"k": 3}
    assert [t.name for t in request.inputs] == ["A", "B", "C"]
    np.testing.assert_array_equal(request.inputs[0].data, np.ones((2, 3), dtype=np.float32))
    np.testing.assert_array_equal(request.inputs[1].data, [4, 5])
    assert request.inputs[2].data.tolist() == [[b"\x00\xff"], [b"q"]]
    assert [(o.name, o.binary_data) for o in request.outputs] == [("X", True), ("Y", False)]
    assert request.binary_output_names(["X", "Y", "Z"]) == {"X"}


def test_parsed_binary_arrays_are_writable_copies() -> None:
    body, header_length = client_request({"IN": SAMPLES["FP32"]}, binary=True)
    tensor = parse_infer_request(body, header_length).inputs[0]
    assert tensor.data.flags.writeable and tensor.data.flags.c_contiguous
    tensor.data[0, 0] = 42.0
    assert body == client_request({"IN": SAMPLES["FP32"]}, binary=True)[0]


def test_client_without_outputs_asks_for_binary_outputs() -> None:
    # tritonclient adds binary_data_output=true when no outputs are named.
    body, header_length = client_request({"IN": SAMPLES["INT8"]}, binary=False)
    request = parse_infer_request(body, header_length)
    assert request.outputs == []
    assert request.binary_output_default() is True
    assert request.binary_output_names(["P", "Q"]) == {"P", "Q"}


@pytest.mark.parametrize(
    ("outputs", "parameters", "expected"),
    [
        ([], {}, set()),
        ([], {"binary_data_output": False}, set()),
        ([RequestedOutput("P")], {"binary_data_output": True}, {"P"}),
        ([RequestedOutput("P", False)], {"binary_data_output": True}, set()),
        ([RequestedOutput("P", True), RequestedOutput("Q")], {}, {"P"}),
    ],
)
def test_binary_output_names(
    outputs: list[RequestedOutput], parameters: dict[str, Any], expected: set[str]
) -> None:
    request = InferRequest(id=None, inputs=[], outputs=outputs, parameters=parameters)
    assert request.binary_output_names(["P", "Q"]) == expected


@pytest.mark.parametrize(
    ("data", "shape"),
    [
        ([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [2, 3]),
        ([1, 2, 3, 4, 5, 6], [2, 3]),
        ([[[1], [2.0]], [[3], [4]], [[5], [6]]], [3, 2, 1]),
        ([[1, 2], 3, [[4, 5], 6]], [6]),
    ],
)
def test_json_data_flat_or_nested_is_row_major(data: list[Any], shape: list[int]) -> None:
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": data}]}
    tensor = parse_infer_request(orjson.dumps(header), None).inputs[0]
    assert tensor.shape == shape
    assert tensor.data.shape == tuple(shape)
    assert tensor.data.reshape(-1).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_empty_tensors_parse() -> None:
    header = {
        "inputs": [
            {"name": "a", "datatype": "FP32", "shape": [0, 384], "data": []},
            {"name": "b", "datatype": "BYTES", "shape": [0], "parameters": {"binary_data_size": 0}},
        ]
    }
    body, header_length = raw_body(header)
    a, b = parse_infer_request(body, header_length).inputs
    assert a.data.shape == (0, 384)
    assert b.data.shape == (0,)


def test_header_length_equal_to_body_without_binary_inputs() -> None:
    body, header_length = raw_body(
        {"inputs": [{"name": "a", "datatype": "BOOL", "shape": [1], "data": [True]}]}
    )
    assert parse_infer_request(body, header_length).inputs[0].data.tolist() == [True]


# --------------------------------------------------------------------------------------------
# Malformed requests

GOOD_INPUT = {"name": "x", "datatype": "INT32", "shape": [2], "data": [1, 2]}


def with_input(**changes: Any) -> dict[str, Any]:
    entry = {**GOOD_INPUT, **changes}
    return {"inputs": [{k: v for k, v in entry.items() if v is not ...}]}


FP32_PAIR = np.array([1, 2], dtype="<f4").tobytes()

MALFORMED: list[tuple[str, bytes, int | None, str]] = [
    ("empty body", b"", None, "not valid JSON"),
    ("not json", b"{inputs", None, "not valid JSON"),
    ("bad utf-8 in header", b'{"id": "\xff"}', None, "not valid JSON"),
    ("top level array", b"[]", None, "must be a JSON object"),
    ("missing inputs", b"{}", None, "no 'inputs'"),
    ("inputs not a list", orjson.dumps({"inputs": {}}), None, "'inputs' must be an array"),
    ("inputs empty", orjson.dumps({"inputs": []}), None, "must not be empty"),
    ("input not an object", orjson.dumps({"inputs": [3]}), None, "inputs[0] must be an object"),
    ("id not a string", orjson.dumps({"id": 5, **with_input()}), None, "'id' must be a string"),
    (
        "parameters not object",
        orjson.dumps({"parameters": [], **with_input()}),
        None,
        "'parameters'",
    ),
    (
        "binary_data_output not bool",
        orjson.dumps({"parameters": {"binary_data_output": 1}, **with_input()}),
        None,
        "'binary_data_output' must be a boolean",
    ),
    ("missing name", orjson.dumps(with_input(name=...)), None, "inputs[0] needs a non-empty"),
    ("empty name", orjson.dumps(with_input(name="")), None, "inputs[0] needs a non-empty"),
    ("missing datatype", orjson.dumps(with_input(datatype=...)), None, "'x' needs a string"),
    ("unknown datatype", orjson.dumps(with_input(datatype="FP8")), None, "unknown datatype 'FP8'"),
    ("bf16", orjson.dumps(with_input(datatype="BF16")), None, "BF16 is not supported"),
    ("missing shape", orjson.dumps(with_input(shape=...)), None, "'x' needs 'shape'"),
    ("shape not list", orjson.dumps(with_input(shape=2)), None, "'x' needs 'shape'"),
    ("negative dim", orjson.dumps(with_input(shape=[-1])), None, "negative dimension"),
    ("float dim", orjson.dumps(with_input(shape=[2.0])), None, "only integers"),
    ("bool dim", orjson.dumps(with_input(shape=[True, 2])), None, "only integers"),
    ("too many dims", orjson.dumps(with_input(shape=[1] * 33)), None, "at most 32"),
    ("huge shape", orjson.dumps(with_input(shape=[0, 2**62, 2**62])), None, "too large"),
    ("no data", orjson.dumps(with_input(data=...)), None, "neither 'data' nor"),
    ("data not list", orjson.dumps(with_input(data=1)), None, "'data' must be an array"),
    ("too few elements", orjson.dumps(with_input(data=[1])), None, "'x': 'data' has 1 elements"),
    ("too many elements", orjson.dumps(with_input(data=[[1, 2], [3]])), None, "has 3 elements"),
    ("string for int", orjson.dumps(with_input(data=[1, "2"])), None, "element 1 is a string"),
    ("float for int", orjson.dumps(with_input(data=[1, 2.5])), None, "must be integers"),
    ("bool for int", orjson.dumps(with_input(data=[True, 2])), None, "element 0 is a boolean"),
    ("null element", orjson.dumps(with_input(data=[1, None])), None, "element 1 is null"),
    ("int out of range", orjson.dumps(with_input(data=[1, 2**31])), None, "2147483648"),
    (
        "uint negative",
        orjson.dumps(with_input(datatype="UINT8", data=[-1, 0])),
        None,
        "must lie in [0, 255]",
    ),
    (
        "fp16 overflow",
        orjson.dumps(with_input(datatype="FP16", data=[1.0, 70000.0])),
        None,
        "out of range for FP16",
    ),
    (
        "int for bool",
        orjson.dumps(with_input(datatype="BOOL", data=[1, 0])),
        None,
        "must be booleans",
    ),
    (
        "number for bytes",
        orjson.dumps(with_input(datatype="BYTES", data=["a", 1])),
        None,
        "must be strings",
    ),
    (
        "object for fp32",
        orjson.dumps(with_input(datatype="FP32", data=[{}, 1.0])),
        None,
        "element 0 is an object",
    ),
    (
        "duplicate input",
        orjson.dumps({"inputs": [GOOD_INPUT, GOOD_INPUT]}),
        None,
        "'x' appears more than once",
    ),
    (
        "shared memory",
        orjson.dumps(with_input(parameters={"shared_memory_region": "r"})),
        None,
        "shared memory",
    ),
    (
        "binary size without header length",
        orjson.dumps(with_input(data=..., datatype="FP32", parameters={"binary_data_size": 8})),
        None,
        "no Inference-Header-Content-Length",
    ),
    (
        "both data and binary size",
        *raw_body(with_input(parameters={"binary_data_size": 8}), FP32_PAIR),
        "both 'data' and 'binary_data_size'",
    ),
    (
        "binary size not an int",
        *raw_body(with_input(data=..., parameters={"binary_data_size": "8"}), FP32_PAIR),
        "non-negative integer",
    ),
    (
        "binary size negative",
        *raw_body(with_input(data=..., parameters={"binary_data_size": -8}), FP32_PAIR),
        "non-negative integer",
    ),
    (
        "binary size past the end",
        *raw_body(with_input(data=..., parameters={"binary_data_size": 9}), FP32_PAIR),
        "runs past the end",
    ),
    (
        "binary size wrong for shape",
        *raw_body(with_input(data=..., shape=[3], parameters={"binary_data_size": 8}), FP32_PAIR),
        "3 INT32 elements take 12",
    ),
    (
        "leftover bytes",
        *raw_body(with_input(data=..., parameters={"binary_data_size": 8}), FP32_PAIR, b"!"),
        "1 bytes of binary data",
    ),
    ("binary but no binary inputs", *raw_body(with_input(), b"xx"), "2 bytes of binary data"),
    ("negative header length", orjson.dumps(with_input()), -1, "must not be negative"),
    ("header length past body", b"{}", 3, "exceeds the body length 2"),
    ("header length cuts json", orjson.dumps(with_input()), 5, "not valid JSON"),
    (
        "bool byte not 0 or 1",
        *raw_body(
            with_input(data=..., datatype="BOOL", parameters={"binary_data_size": 2}), b"\x01\x02"
        ),
        "bytes 0 or 1",
    ),
    (
        "bytes truncated prefix",
        *raw_body(
            with_input(data=..., datatype="BYTES", parameters={"binary_data_size": 7}),
            b"\x01\x00\x00\x00a\x00\x00",
        ),
        "truncated length prefix",
    ),
    (
        "bytes element past buffer",
        *raw_body(
            with_input(data=..., datatype="BYTES", parameters={"binary_data_size": 6}),
            b"\x05\x00\x00\x00ab",
        ),
        "claims 5 bytes but only 2 remain",
    ),
    (
        "bytes too few elements",
        *raw_body(
            with_input(data=..., datatype="BYTES", parameters={"binary_data_size": 5}),
            b"\x01\x00\x00\x00a",
        ),
        "holds 1 elements but the shape needs 2",
    ),
    (
        "bytes too many elements",
        *raw_body(
            with_input(data=..., datatype="BYTES", parameters={"binary_data_size": 12}),
            b"\x00\x00\x00\x00" * 3,
        ),
        "more than the 2 elements",
    ),
    (
        "outputs not list",
        orjson.dumps({"outputs": {}, **with_input()}),
        None,
        "'outputs' must be an array",
    ),
    ("output not object", orjson.dumps({"outputs": ["y"], **with_input()}), None, "outputs[0]"),
    ("output no name", orjson.dumps({"outputs": [{}], **with_input()}), None, "outputs[0] needs"),
    (
        "output binary_data not bool",
        orjson.dumps(
            {"outputs": [{"name": "y", "parameters": {"binary_data": 1}}], **with_input()}
        ),
        None,
        "'binary_data' must be a boolean",
    ),
    (
        "duplicate output",
        orjson.dumps({"outputs": [{"name": "y"}, {"name": "y"}], **with_input()}),
        None,
        "requested more than once",
    ),
    (
        "classification",
        orjson.dumps(
            {"outputs": [{"name": "y", "parameters": {"classification": 3}}], **with_input()}
        ),
        None,
        "classification",
    ),
]


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [case[1:] for case in MALFORMED],
    ids=[case[0] for case in MALFORMED],
)
def test_malformed_requests_raise_invalid_request(
    body: bytes, header_length: int | None, message: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_infer_request(body, header_length)
    assert message in str(caught.value)


# --------------------------------------------------------------------------------------------
# Responses decoded by tritonclient


def sample_tensor(datatype: str, name: str | None = None) -> InferTensor:
    sample = SAMPLES[datatype]
    return InferTensor(name or datatype, datatype, list(sample.shape), sample)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_tritonclient_decodes_every_datatype(datatype: str, binary: bool) -> None:
    tensor = sample_tensor(datatype, "OUT")
    body, header_length = encode_infer_response(
        "model", "1", "id-1", [tensor], {"OUT"} if binary else set()
    )
    assert (header_length is not None) == binary

    result = triton.InferenceServerClient.parse_response_body(body, header_length=header_length)

    assert_same(result.as_numpy("OUT"), SAMPLES[datatype])
    assert result.get_output("OUT")["datatype"] == datatype


def test_tritonclient_decodes_mixed_response() -> None:
    outputs = [sample_tensor(name) for name in ["FP32", "BYTES", "FP16", "BOOL", "INT64"]]
    body, header_length = encode_infer_response(
        "embedder", "3", "abc", outputs, {"FP32", "FP16", "INT64"}
    )

    result = triton.InferenceServerClient.parse_response_body(body, header_length=header_length)

    response = result.get_response()
    assert response["model_name"] == "embedder"
    assert response["model_version"] == "3"
    assert response["id"] == "abc"
    for tensor in outputs:
        assert_same(result.as_numpy(tensor.name), tensor.data)
    by_name = {o["name"]: o for o in response["outputs"]}
    assert "data" not in by_name["FP32"]
    assert by_name["FP32"]["parameters"] == {"binary_data_size": 48}
    assert "parameters" not in by_name["BYTES"]


def test_response_json_data_is_flat_row_major_and_optional_fields_omitted() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = InferTensor("E", "FP32", [2, 3], data)
    body, header_length = encode_infer_response("m", None, None, [tensor], set())
    assert header_length is None
    assert orjson.loads(body) == {
        "model_name": "m",
        "outputs": [{"name": "E", "datatype": "FP32", "shape": [2, 3], "data": [0, 1, 2, 3, 4, 5]}],
    }


def test_response_empty_binary_tensor() -> None:
    tensor = InferTensor("E", "FP32", [0, 4], np.zeros((0, 4), dtype=np.float32))
    body, header_length = encode_infer_response("m", "1", None, [tensor], {"E"})
    assert header_length == len(body)
    result = triton.InferenceServerClient.parse_response_body(body, header_length=header_length)
    assert result.as_numpy("E").shape == (0, 4)


def test_response_casts_data_to_its_datatype_little_endian() -> None:
    big_endian = np.array([1.5, -2.0], dtype=">f8")
    tensor = InferTensor("E", "FP32", [2], big_endian)
    body, header_length = encode_infer_response("m", "1", None, [tensor], {"E"})
    assert header_length is not None
    assert body[header_length:] == np.array([1.5, -2.0], dtype="<f4").tobytes()


def test_response_non_utf8_bytes_need_binary() -> None:
    tensor = InferTensor("B", "BYTES", [1], np.array([b"\xff"], dtype=object))
    with pytest.raises(InvalidRequest, match="binary_data"):
        encode_infer_response("m", "1", None, [tensor], set())
    body, header_length = encode_infer_response("m", "1", None, [tensor], {"B"})
    result = triton.InferenceServerClient.parse_response_body(body, header_length=header_length)
    assert result.as_numpy("B").tolist() == [b"\xff"]


def test_response_rejects_data_that_does_not_fit_its_shape() -> None:
    tensor = InferTensor("E", "FP32", [3], np.zeros(2, dtype=np.float32))
    with pytest.raises(ValueError, match="2 elements but shape"):
        encode_infer_response("m", "1", None, [tensor], set())


# --------------------------------------------------------------------------------------------
# Rows


def test_tensor_from_rows_stacks_embeddings() -> None:
    rows = [np.full(384, i, dtype=np.float32) for i in range(5)]
    tensor = tensor_from_rows("embedding", rows)
    assert (tensor.name, tensor.datatype, tensor.shape) == ("embedding", "FP32", [5, 384])
    np.testing.assert_array_equal(tensor.data[3], rows[3])


@pytest.mark.parametrize(
    ("rows", "datatype", "shape", "values"),
    [
        (["a", "b", "c"], "BYTES", [3, 1], [["a"], ["b"], ["c"]]),
        ([b"a", "b"], "BYTES", [2, 1], [[b"a"], ["b"]]),
        ([{"k": 1}, [1, 2], None], "BYTES", [3, 1], [[b'{"k":1}'], [b"[1,2]"], [b"null"]]),
        ([{"v": np.float32(0.5)}], "BYTES", [1, 1], [[b'{"v":0.5}']]),
        (["a", 1], "BYTES", [2, 1], [[b'"a"'], [b"1"]]),
        ([True, False], "BOOL", [2, 1], [[True], [False]]),
        ([1, -2], "INT64", [2, 1], [[1], [-2]]),
        ([2**64, 1], "FP64", [2, 1], [[2.0**64], [1.0]]),
        ([1, 0.5], "FP64", [2, 1], [[1.0], [0.5]]),
        ([True, 1], "BYTES", [2, 1], [[b"true"], [b"1"]]),
        ([np.float32(1), np.float32(2)], "FP32", [2, 1], [[1.0], [2.0]]),
        ([np.zeros(2, np.int8), np.ones(3, np.int8)], "BYTES", [2, 1], [[b"[0,0]"], [b"[1,1,1]"]]),
        (np.array([1, 2], dtype=np.uint16), "UINT16", [2, 1], [[1], [2]]),
        (np.array([["a"], ["b"]]), "BYTES", [2, 1], [["a"], ["b"]]),
        (np.ones((2, 2, 2), dtype=np.float16), "FP16", [2, 2, 2], np.ones((2, 2, 2)).tolist()),
    ],
)
def test_tensor_from_rows_table(
    rows: Any, datatype: str, shape: list[int], values: list[Any]
) -> None:
    tensor = tensor_from_rows("out", rows)
    assert (tensor.datatype, tensor.shape) == (datatype, shape)
    assert tensor.data.dtype == DATATYPES[datatype]
    assert tensor.data.shape == tuple(shape)
    assert tensor.data.tolist() == values


def test_tensor_from_rows_errors() -> None:
    with pytest.raises(ValueError, match="no rows"):
        tensor_from_rows("out", [])
    with pytest.raises(ValueError, match="no v2 datatype"):
        tensor_from_rows("out", [np.array([1j]), np.array([2j])])
    with pytest.raises(TypeError):
        tensor_from_rows("out", [object()])


def test_tensor_from_rows_round_trips_through_tritonclient() -> None:
    outputs = [
        tensor_from_rows("vec", [np.array([0.5, 1.5], dtype=np.float32)] * 3),
        tensor_from_rows("doc", [{"label": "x", "score": 0.25}, {"label": "y"}, {}]),
    ]
    body, header_length = encode_infer_response("m", "1", None, outputs, {"vec"})
    result = triton.InferenceServerClient.parse_response_body(body, header_length=header_length)
    assert result.as_numpy("vec").shape == (3, 2)
    docs = [orjson.loads(item) for item in result.as_numpy("doc").reshape(-1)]
    assert docs == [{"label": "x", "score": 0.25}, {"label": "y"}, {}]


@pytest.mark.parametrize("shape", [[3], [3, 1]])
def test_rows_from_bytes_tensor_gives_str(shape: list[int]) -> None:
    data = np.array([b"caf\xc3\xa9", "tea", b""], dtype=object).reshape(shape)
    assert rows_from_tensor(InferTensor("t", "BYTES", shape, data)) == ["caf\u00e9", "tea", ""]


def test_rows_from_bytes_pairs_give_lists() -> None:
    data = np.array([[b"q1", b"d1"], [b"q2", b"d2"]], dtype=object)
    rows = rows_from_tensor(InferTensor("t", "BYTES", [2, 2], data))
    assert rows == [["q1", "d1"], ["q2", "d2"]]


def test_rows_from_numeric_tensor_gives_numpy_rows() -> None:
    data = np.arange(6, dtype=np.int32).reshape(3, 2)
    rows = rows_from_tensor(InferTensor("t", "INT32", [3, 2], data))
    assert len(rows) == 3
    assert all(isinstance(row, np.ndarray) and row.shape == (2,) for row in rows)
    np.testing.assert_array_equal(rows[2], [4, 5])


def test_rows_from_tensor_errors() -> None:
    bad = InferTensor("t", "BYTES", [2], np.array([b"ok", b"\xff\xfe"], dtype=object))
    with pytest.raises(UnprocessableInput, match="element 1 is not valid UTF-8"):
        rows_from_tensor(bad)
    scalar = InferTensor("s", "FP32", [], np.array(1.0, dtype=np.float32))
    with pytest.raises(UnprocessableInput, match="first dimension must be the batch"):
        rows_from_tensor(scalar)


def test_rows_survive_a_client_round_trip() -> None:
    texts = np.array([["first"], ["second \u2603"]], dtype=object)
    body, header_length = client_request({"TEXT": texts}, binary=True)
    tensor = parse_infer_request(body, header_length).inputs[0]
    assert rows_from_tensor(tensor) == ["first", "second \u2603"]


def test_datatype_of() -> None:
    assert datatype_of(np.dtype(">i2")) == "INT16"
    assert datatype_of(np.dtype("U3")) == "BYTES"
    assert all(datatype_of(dtype) == name for name, dtype in DATATYPES.items())
    with pytest.raises(ValueError, match="no v2 datatype"):
        datatype_of(np.dtype("M8[s]"))


# --------------------------------------------------------------------------------------------
# Properties

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)  # orjson's range
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)
header_lengths = st.none() | st.integers(min_value=-3, max_value=300)
json_leaves = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text()
# json_values alone is mostly containers; a flaw should as often be a wrong scalar.
wrong_values = json_leaves | json_values


def only_client_errors(body: bytes, header_length: int | None) -> None:
    try:
        request = parse_infer_request(body, header_length)
    except (InvalidRequest, UnprocessableInput) as error:
        assert str(error)
        return
    assert request.id is None or isinstance(request.id, str)
    for tensor in request.inputs:
        assert tensor.data.shape == tuple(tensor.shape)
        assert tensor.data.dtype == DATATYPES[tensor.datatype]
        if tensor.datatype == "BYTES":
            assert all(isinstance(item, str | bytes) for item in tensor.data.flat)


@FUZZ
@given(st.binary(max_size=200), header_lengths)
def test_arbitrary_bytes_raise_only_client_errors(body: bytes, header_length: int | None) -> None:
    only_client_errors(body, header_length)


@FUZZ
@given(json_values, st.binary(max_size=40), st.booleans())
def test_arbitrary_json_headers_raise_only_client_errors(
    header: Any, tail: bytes, use_length: bool
) -> None:
    encoded = orjson.dumps(header)
    only_client_errors(encoded + tail, len(encoded) if use_length else None)


scalars_for = {
    "BOOL": st.booleans(),
    "BYTES": st.text(max_size=4),
    "FP16": st.floats(width=16, allow_nan=False, allow_infinity=False),
    "FP32": st.floats(width=32, allow_nan=False, allow_infinity=False),
    "FP64": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**63), 2**63 - 1),
}


FLAWS = [
    None,
    "datatype",
    "dimension",
    "shape",
    "count",
    "element",
    "data",
    "size",
    "buffer",
    "field",
    "header length",
]


@st.composite
def near_valid_requests(draw: st.DrawFn, flaw: str | None) -> tuple[bytes, int | None]:
    """Valid requests with at most one flaw, so fuzzing reaches every check past the first."""
    inputs: list[dict[str, Any]] = []
    buffers: list[bytes] = []
    input_count = draw(st.integers(1, 3))
    flawed_input = draw(st.integers(0, input_count - 1))
    for index in range(input_count):
        here = flaw if index == flawed_input else None
        datatype = draw(st.sampled_from(sorted(DATATYPES)))
        dtype = DATATYPES[datatype]
        shape: Any = draw(st.lists(st.integers(0, 3), max_size=3))
        count = int(np.prod(shape))
        if here == "count":
            count = max(count + draw(st.sampled_from([-1, 1])), 0)
        entry: dict[str, Any] = {"name": f"in{index}", "datatype": datatype, "shape": shape}
        as_json = here in {"element", "data"} or (
            here not in {"size", "buffer"} and draw(st.booleans())
        )
        if as_json:
            if dtype.kind in "iu":
                info = np.iinfo(dtype)
                scalar = st.integers(int(info.min), int(info.max))
            else:
                scalar = scalars_for[datatype]
            data: Any = draw(st.lists(scalar, min_size=count, max_size=count))
            if here == "element":
                # Replaces an element, or appends one when the position is the end.
                position = draw(st.integers(0, len(data)))
                data[position : position + 1] = [draw(wrong_values)]
            if data and draw(st.booleans()):
                # Nest in pairs, as clients that send shaped data do.
                data = [data[i : i + 2] for i in range(0, len(data), 2)]
            entry["data"] = draw(wrong_values) if here == "data" else data
        else:
            if datatype == "BYTES":
                items = draw(st.lists(st.binary(max_size=5), min_size=count, max_size=count))
                raw = b"".join(len(i).to_bytes(4, "little") + i for i in items)
            else:
                raw = draw(st.binary(min_size=count * dtype.itemsize))[: count * dtype.itemsize]
                if datatype == "BOOL":
                    raw = bytes(b % 2 for b in raw)
            if here == "buffer":
                raw = draw(st.binary(max_size=3)) + raw[: draw(st.integers(0, len(raw)))]
            size: Any = len(raw)
            if here == "size":
                size = draw(wrong_values | st.integers(-2, len(raw) + 2))
            entry["parameters"] = {"binary_data_size": size}
            buffers.append(raw)
        if here == "datatype":
            entry["datatype"] = draw(st.sampled_from(["BF16", "fp32", ""]) | wrong_values)
        if here == "dimension":
            shape.insert(draw(st.integers(0, len(shape))), draw(wrong_values))
        if here == "shape":
            entry["shape"] = draw(wrong_values)
        inputs.append(entry)

    header: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        header["outputs"] = [{"name": "out", "parameters": {"binary_data": draw(st.booleans())}}]
    if draw(st.booleans()):
        header["parameters"] = {"binary_data_output": draw(st.booleans())}
    if flaw == "field":
        header[draw(st.sampled_from(["id", "outputs", "parameters", "inputs"]))] = draw(
            wrong_values
        )
    encoded = orjson.dumps(header)
    body = encoded + b"".join(buffers)
    header_length: int | None = len(encoded)
    if flaw == "header length":
        header_length = draw(st.none() | st.integers(-1, len(body) + 1))
    return body, header_length


# One test per flaw: hypothesis draws unevenly from sampled_from, and rare flaws went unseen.
@pytest.mark.parametrize("flaw", FLAWS)
@settings(FUZZ, max_examples=80)
@given(data=st.data())
def test_near_valid_requests_raise_only_client_errors(
    flaw: str | None, data: st.DataObject
) -> None:
    only_client_errors(*data.draw(near_valid_requests(flaw)))


numeric_arrays = st.sampled_from([name for name in DATATYPES if name != "BYTES"]).flatmap(
    lambda name: st.tuples(
        st.just(name),
        st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=3),
        st.binary(min_size=64, max_size=64),
    )
)


@settings(max_examples=100, deadline=None)
@given(numeric_arrays, st.booleans())
def test_any_client_tensor_round_trips(case: tuple[str, list[int], bytes], binary: bool) -> None:
    datatype, shape, noise = case
    dtype = DATATYPES[datatype]
    count = int(np.prod(shape))
    raw = (noise * (count * dtype.itemsize // len(noise) + 1))[: count * dtype.itemsize]
    array = np.frombuffer(raw, dtype=np.uint8).view(dtype).reshape(shape)
    if datatype == "BOOL":
        array = array.view(np.uint8) % 2 == 1
    if dtype.kind == "f":
        # NaN and infinity have no JSON form, and NaN never equals itself.
        array = np.where(np.isfinite(array), array, 0).astype(dtype)

    body, header_length = client_request({"T": array}, binary)
    tensor = parse_infer_request(body, header_length).inputs[0]
    assert_same(tensor.data, array)

    response, response_length = encode_infer_response(
        "m", "1", None, [tensor], {"T"} if binary else set()
    )
    result = triton.InferenceServerClient.parse_response_body(
        response, header_length=response_length
    )
    assert_same(result.as_numpy("T"), array)
