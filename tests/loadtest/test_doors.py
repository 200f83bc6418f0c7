"""Every front door the load tool drives: KServe v2 with binary tensors, the OpenAI
embeddings API and KServe v2 over gRPC, beside plain HTTP. Bodies are checked byte by byte;
short runs go against a real server, in a thread of this process, with its gRPC door on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import orjson
import pytest

from batching import ModelConfig, create_app
from load_test.client import LoadSpec, Target, count_outputs, run_load
from load_test.grpc_client import infer_requests
from load_test.http1 import build_request
from load_test.measure import measure
from load_test.payloads import GRPC_METHOD, build_payloads, bytes_tensor
from load_test.schedule import Segment
from load_test.serverproc import free_port
from tests.support.threaded import serving_in_thread


def _texts_of_bytes_tensor(data: bytes) -> list[str]:
    texts, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "little")
        texts.append(data[pos + 4 : pos + 4 + length].decode("utf-8"))
        pos += 4 + length
    assert pos == len(data)
    return texts


def _v2_texts(seed: int = 3) -> list[list[str]]:
    """The texts of the v2 JSON bodies: every door carries the same texts for a seed."""
    payloads = build_payloads(api="v2", items=(1, 5), count=40, seed=seed)
    return [orjson.loads(p.body)["inputs"][0]["data"] for p in payloads.payloads]


# --- bodies --------------------------------------------------------------------------------


def test_bytes_tensor_is_length_prefixed_utf8() -> None:
    assert bytes_tensor(["ab", "", "é"]) == (
        b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x02\x00\x00\x00\xc3\xa9"
    )


def test_v2_binary_bodies_are_a_json_header_then_the_tensor() -> None:
    payloads = build_payloads(api="v2-binary", items=(1, 5), count=40, seed=3, model_name="m")
    assert payloads.path == "/v2/models/m/infer"
    assert payloads.content_type == "application/octet-stream"
    for payload, texts in zip(payloads.payloads, _v2_texts(), strict=True):
        ((name, value),) = payload.headers
        assert name == "Inference-Header-Content-Length"
        length = int(value)
        header = orjson.loads(payload.body[:length])
        assert header["parameters"] == {"binary_data_output": True}
        (tensor,) = header["inputs"]
        assert tensor["name"] == "text" and tensor["datatype"] == "BYTES"
        assert tensor["shape"] == [payload.items, 1]
        assert "data" not in tensor
        data = payload.body[length:]
        assert tensor["parameters"] == {"binary_data_size": len(data)}
        assert data == bytes_tensor(texts)
        assert _texts_of_bytes_tensor(data) == texts
        assert len(texts) == payload.items
    # The header travels with the request, byte for byte.
    first = payloads.payloads[0]
    raw = build_request("h:1", payloads.path, payloads.content_type, first.body, first.headers)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert body == first.body
    assert f"Inference-Header-Content-Length: {first.headers[0][1]}\r\n".encode() in head + b"\r\n"
    assert b"Content-Type: application/octet-stream\r\n" in head


@pytest.mark.parametrize("encoding", ["base64", "float"])
def test_openai_bodies_name_the_model_and_the_encoding(encoding: str) -> None:
    kwargs: dict[str, Any] = {} if encoding == "base64" else {"openai_encoding": encoding}
    payloads = build_payloads(
        api="openai", items=(1, 5), count=40, seed=3, model_name="vectors", **kwargs
    )
    assert payloads.path == "/v1/embeddings"
    assert payloads.content_type == "application/json"
    for payload, texts in zip(payloads.payloads, _v2_texts(), strict=True):
        assert payload.headers == ()
        assert orjson.loads(payload.body) == {
            "model": "vectors",
            "input": texts,
            "encoding_format": encoding,
        }
    with pytest.raises(ValueError, match="encoding"):
        build_payloads(api="openai", items=(1, 1), openai_encoding="hex")


def test_grpc_requests_carry_the_tensor_in_raw_input_contents() -> None:
    payloads = build_payloads(api="grpc", items=(1, 5), count=40, seed=3, model_name="echo")
    assert payloads.path == GRPC_METHOD
    requests = infer_requests(payloads)
    for payload, request, texts in zip(payloads.payloads, requests, _v2_texts(), strict=True):
        assert payload.body == bytes_tensor(texts)
        assert request.model_name == "echo"
        (tensor,) = request.inputs
        assert (tensor.name, tensor.datatype, list(tensor.shape)) == (
            "text",
            "BYTES",
            [len(texts), 1],
        )
        assert list(request.raw_input_contents) == [payload.body]


def test_answers_are_counted_per_door() -> None:
    header = orjson.dumps(
        {
            "outputs": [
                {"name": "e", "shape": [3, 4], "parameters": {"binary_data_size": 48}},
                {"name": "n", "shape": [3], "data": [1, 2, 3]},
            ]
        }
    )
    body = header + bytes(48)
    assert count_outputs("v2-binary", body, len(header)) == 3
    # Binary data missing or in excess, or a header length past the body: malformed.
    assert count_outputs("v2-binary", body[:-1], len(header)) is None
    assert count_outputs("v2-binary", body + b"x", len(header)) is None
    assert count_outputs("v2-binary", body, len(body) + 1) is None
    assert count_outputs("v2-binary", body, -1) is None
    # A JSON answer to a binary request still counts.
    json_answer = b'{"outputs": [{"name": "e", "shape": [2, 4], "data": []}]}'
    assert count_outputs("v2-binary", json_answer) == 2
    assert count_outputs("openai", b'{"object": "list", "data": [{"embedding": "AAAA"}]}') == 1
    assert count_outputs("openai", b'{"error": {"message": "no"}}') is None


# --- end to end against the real server ----------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, str]]:
    """The server with an echo model and a stand-in embedder, over HTTP and gRPC."""
    grpc_port = free_port()
    models = [
        ModelConfig(name="echo", source="tests.support.models:EchoModel"),
        ModelConfig(name="vectors", source="tests.support.models:VectorModel"),
    ]
    with serving_in_thread(create_app(models, grpc_port=grpc_port)) as url:
        yield url, f"127.0.0.1:{grpc_port}"


DOORS = [
    ("json", "echo"),
    ("v2", "echo"),
    ("v2-binary", "echo"),
    ("openai", "vectors"),
    ("grpc", "echo"),
]


@pytest.mark.parametrize(("api", "model"), DOORS)
def test_every_door_answers_a_short_closed_loop(
    server: tuple[str, str], api: str, model: str
) -> None:
    url, grpc_target = server
    payloads = build_payloads(api=api, items=(1, 4), count=64, seed=1, model_name=model)
    spec = LoadSpec(
        payloads=payloads, concurrency=8, requests=80, timeout=30, grpc_target=grpc_target
    )
    measured = measure(Target.parse(url), spec, warmup=8)
    doc = measured.doc
    summary = doc["summary"]
    assert summary["outcomes"]["200"] == 80, summary["outcomes"]
    assert summary["outcomes"]["invalid_responses"] == 0
    sent_items = sum(payloads.payloads[i % 64].items for i in range(80))
    assert summary["ok_items"] == sent_items
    # The server batched exactly those items, whichever door they came through.
    batches = doc["server_batches"][f'model="{model}"']
    assert batches["items"] == sent_items
    assert 0 < batches["batches"] <= 80
    assert doc["load"]["api"] == api
    if api == "grpc":
        assert doc["load"]["grpc_target"] == grpc_target
        assert doc["client"]["connections_opened"] == 1


@pytest.mark.parametrize("encoding", ["base64", "float"])
def test_openai_answers_in_either_encoding(server: tuple[str, str], encoding: str) -> None:
    url, _ = server
    payloads = build_payloads(
        api="openai", items=(2, 2), count=4, model_name="vectors", openai_encoding=encoding
    )
    spec = LoadSpec(payloads=payloads, concurrency=2, requests=10, timeout=30)
    result = asyncio.run(run_load(Target.parse(url), spec))
    assert result.records.ok == 10, result.records.errors


def test_a_wrong_output_count_is_invalid(server: tuple[str, str]) -> None:
    """Validation reads the real answers: a binary v2 body whose tool-side item count is off
    by one is answered with fewer outputs than the tool expects. Over gRPC the count is the
    tensor's shape itself, so the server refuses the mismatch (INVALID_ARGUMENT: 400)."""
    url, grpc_target = server
    for api in ("v2-binary", "grpc"):
        honest = build_payloads(api=api, items=(2, 2), count=1, model_name="echo")
        (payload,) = honest.payloads
        lying = replace(honest, payloads=(replace(payload, items=3),))
        spec = LoadSpec(payloads=lying, concurrency=1, requests=3, grpc_target=grpc_target)
        records = asyncio.run(run_load(Target.parse(url), spec)).records
        assert records.ok == 0 and len(records) == 3
        if api == "grpc":
            assert records.status == [400, 400, 400]
        else:
            assert dict(records.errors) == {"invalid: 2 outputs for 3 inputs": 3}


def test_grpc_open_loop_and_status_codes(server: tuple[str, str]) -> None:
    url, grpc_target = server
    target = Target.parse(url)
    payloads = build_payloads(api="grpc", items=(1, 2), count=8, model_name="echo")
    open_loop = LoadSpec(
        payloads=payloads,
        segments=(Segment(200, 200, 0.25),),
        process="fixed",
        duration=0.25,
        max_connections=4,
        grpc_target=grpc_target,
    )
    result = asyncio.run(run_load(target, open_loop))
    assert len(result.records) >= 40 and result.records.ok == len(result.records)

    # A model the server does not serve: NOT_FOUND, recorded as 404.
    unknown = build_payloads(api="grpc", items=(1, 1), count=1, model_name="nope")
    spec = LoadSpec(payloads=unknown, concurrency=1, requests=2, grpc_target=grpc_target)
    records = asyncio.run(run_load(target, spec)).records
    assert records.status == [404, 404]

    # Nothing listening: connection errors, not a server's 503.
    closed = f"127.0.0.1:{free_port()}"
    spec = LoadSpec(payloads=payloads, concurrency=1, requests=2, grpc_target=closed, timeout=5)
    records = asyncio.run(run_load(target, spec)).records
    assert records.ok == 0 and sum(records.errors.values()) == 2, records.errors
    assert set(records.errors) == {"ConnectionError"}


def test_cli_drives_each_new_door(server: tuple[str, str], tmp_path: Any) -> None:
    from load_test.__main__ import main

    url, grpc_target = server
    runs = [
        ["--api", "v2-binary", "--model-name", "echo"],
        ["--api", "v2-binary", "--model-name", "echo", "--http-client", "httpx"],
        ["--api", "openai", "--model-name", "vectors", "--openai-encoding", "float"],
        ["--api", "grpc", "--model-name", "echo", "--grpc-url", grpc_target],
    ]
    for index, extra in enumerate(runs):
        out = tmp_path / str(index)
        args = ["run", "--no-progress", "--no-plots", "--url", url, "-c", "2", "-n", "10"]
        assert main([*args, "--items", "1-3", "--out-dir", str(out), *extra]) == 0
        doc = orjson.loads((out / "result.json").read_bytes())
        assert doc["summary"]["outcomes"]["200"] == 10, extra


def test_cli_stops_early_for_a_model_the_openai_door_does_not_serve(
    server: tuple[str, str], tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from load_test.__main__ import main

    url, _ = server
    with pytest.raises(SystemExit):
        main(
            [
                "run",
                "--url",
                url,
                "--api",
                "openai",
                "--model-name",
                "echo",
                "-n",
                "2",
                "--out-dir",
                str(tmp_path),
            ]
        )
    assert "--model-name" in capsys.readouterr().err


def test_a_started_server_gets_a_free_grpc_port_the_run_then_uses() -> None:
    from load_test.__main__ import _grpc_for_started_server, build_parser

    args = build_parser().parse_args(["tune", "--p99-ms", "50", "--api", "grpc"])
    _grpc_for_started_server(args)
    host, _, port = args.grpc_url.partition(":")
    assert host == "127.0.0.1" and args.server_arg == [f"--grpc-port={port}"]
    # Told where the gRPC door is, or not on gRPC: the server's flags stay as given.
    for argv in (["--api", "grpc", "--grpc-url", "h:9"], ["--api", "v2"]):
        args = build_parser().parse_args(["tune", "--p99-ms", "50", *argv])
        _grpc_for_started_server(args)
        assert args.server_arg == []
    assert Target.parse("http://example.com:8000").grpc_default == "example.com:8001"
