"""Per-token vectors on the v2 door, as ragged outputs, through tritonclient over HTTP and
gRPC against one real server (a stand-in model with one token per character, see
tests/support/token_models.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from google.protobuf.json_format import ParseDict
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.models import VectorModel
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread
from tests.support.token_models import CLS, SEP, CharTokenModel

TEXTS = ["ab", "cde", "f"]
TOKEN_OUTPUTS = ["token_embeddings", "token_ids", "token_counts"]


def ids_of(text: str) -> list[int]:
    return [CLS, *(ord(char) + 3 for char in text), SEP]


def expected(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = [ids_of(text) for text in texts]
    rows = [[i, position, len(run)] for run in ids for position, i in enumerate(run)]
    flat = [i for run in ids for i in run]
    return (
        np.array(rows, dtype=np.float32),
        np.array(flat, dtype=np.int64),
        np.array([len(run) for run in ids], dtype=np.int64),
    )


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, str, CharTokenModel]]:
    chars = CharTokenModel()
    models = {"chars": chars, "plain": VectorModel()}
    port = free_port()
    app = create_app(
        [
            ModelConfig(name="chars", batching=BatchingConfig(max_batch_size=8)),
            ModelConfig(name="plain"),
        ],
        builder=lambda config: models[config.name],
        grpc_port=port,
    )
    with serving_in_thread(app) as url:
        yield url.removeprefix("http://"), f"127.0.0.1:{port}", chars


def _texts(module: Any, texts: list[str]) -> Any:
    tensor = module.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()] for text in texts], dtype=object))
    return tensor


def _infer(
    kind: str,
    server: tuple[str, str, CharTokenModel],
    texts: list[str],
    outputs: list[str],
    parameters: dict[str, Any] | None = None,
    model: str = "chars",
) -> Any:
    http_url, grpc_url, _ = server
    module: Any = triton_http if kind == "http" else triton_grpc
    client = module.InferenceServerClient(http_url if kind == "http" else grpc_url)
    try:
        return client.infer(
            model,
            [_texts(module, texts)],
            outputs=[module.InferRequestedOutput(name) for name in outputs],
            parameters=parameters,
        )
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_the_ragged_outputs_hold_every_items_token_rows_in_order(
    server: tuple[str, str, CharTokenModel], kind: str
) -> None:
    result = _infer(kind, server, TEXTS, TOKEN_OUTPUTS)
    vectors, ids, counts = expected(TEXTS)
    np.testing.assert_array_equal(result.as_numpy("token_embeddings"), vectors)
    np.testing.assert_array_equal(result.as_numpy("token_ids"), ids)
    np.testing.assert_array_equal(result.as_numpy("token_counts"), counts)
    # Item i's rows start at the sum of the counts before it.
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    second = result.as_numpy("token_embeddings")[starts[1] : starts[1] + counts[1]]
    np.testing.assert_array_equal(second[:, 0], ids_of("cde"))
    if kind == "http":
        parameters = result.get_response()["parameters"]
    else:
        raw = result.get_response().parameters
        parameters = {
            key: getattr(raw[key], raw[key].WhichOneof("parameter_choice")) for key in raw
        }
    assert parameters["prompt_tokens"] == int(counts.sum())
    assert parameters["truncated"] is False


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_one_ragged_output_alone_and_the_options_as_parameters(
    server: tuple[str, str, CharTokenModel], kind: str
) -> None:
    text = "abcdefghijklmnop"
    result = _infer(
        kind,
        server,
        [text],
        ["token_ids"],
        {"truncation_direction": "left", "prompt_name": "query"},
    )
    np.testing.assert_array_equal(result.as_numpy("token_ids"), ids_of(("q: " + text)[-10:]))
    assert result.as_numpy("token_embeddings") is None


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_the_pooled_output_is_unchanged(server: tuple[str, str, CharTokenModel], kind: str) -> None:
    result = _infer(kind, server, TEXTS, ["embedding"])
    assert result.as_numpy("embedding").shape == (3, 4)
    assert result.as_numpy("token_ids") is None


@pytest.mark.parametrize(
    ("outputs", "parameters", "model", "words"),
    [
        (["token_ids", "embedding"], None, "chars", "not both"),
        (["token_ids"], None, "plain", "unexpected inference output 'token_ids'"),
        (["token_ids"], {"truncation_direction": "up"}, "chars", "'left' or 'right'"),
        (["token_ids"], {"dimensions": 2}, "chars", "keep their width"),
        (["token_ids"], {"shuffle": True}, "chars", "unknown option 'shuffle'"),
        (["token_ids"], {"prompt_name": "passage"}, "chars", "no prompt named"),
        (["token_ids"], {"truncate": False}, "chars", "has 18 tokens"),
    ],
)
@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_bad_per_token_requests_are_refused(
    server: tuple[str, str, CharTokenModel],
    kind: str,
    outputs: list[str],
    parameters: dict[str, Any] | None,
    model: str,
    words: str,
) -> None:
    with pytest.raises(InferenceServerException, match=words) as raised:
        _infer(kind, server, ["a" * 16], outputs, parameters, model)
    status = raised.value.status()
    if kind == "grpc":
        assert status == "StatusCode.INVALID_ARGUMENT"  # 413 too, see batching/grpc/errors.py
    else:
        assert status == ("413" if "has 18 tokens" in words else "400")


def test_the_metadata_and_configuration_describe_the_ragged_outputs(
    server: tuple[str, str, CharTokenModel],
) -> None:
    http_url, grpc_url, _ = server
    http = triton_http.InferenceServerClient(http_url)
    grpc = triton_grpc.InferenceServerClient(grpc_url)
    try:
        metadata = http.get_model_metadata("chars")
        # Listed apart, so a client that asks for every listed output (perf_analyzer) keeps
        # the pooled answer.
        assert [output["name"] for output in metadata["outputs"]] == ["embedding"]
        outputs = {output["name"]: output for output in metadata["per_token_outputs"]}
        assert list(outputs) == list(TOKEN_OUTPUTS)
        assert outputs["token_embeddings"]["shape"] == [-1, 3]
        assert outputs["token_embeddings"]["ragged"] is True
        assert outputs["token_ids"]["datatype"] == "INT64"
        assert "ragged" not in outputs["token_counts"]
        names = [output.name for output in grpc.get_model_metadata("chars").outputs]
        assert names == ["embedding"]
        config = http.get_model_config("chars")
        # Every key is a field of Triton's ModelConfig.
        ParseDict(config, model_config_pb2.ModelConfig(), ignore_unknown_fields=False)
        assert config["parameters"]["ragged_outputs"] == {
            "string_value": "token_embeddings,token_ids"
        }
        grpc_config = grpc.get_model_config("chars").config
        assert [output.name for output in grpc_config.output] == ["embedding"]
        described = json.loads(grpc_config.parameters["per_token_outputs"].string_value)
        assert [output["name"] for output in described] == list(TOKEN_OUTPUTS)
        plain = http.get_model_metadata("plain")
        assert [output["name"] for output in plain["outputs"]] == ["embedding"]
    finally:
        http.close()
        grpc.close()
