"""Per-request embedding options on every door (prompt_name, input_type, truncate,
truncation_direction, dimensions, encodings), against a model that declares ``"embedding"``
metadata and records the items it got: plain JSON and KServe v2 in-process, then the
``openai`` SDK, tritonclient.http and tritonclient.grpc against one real server."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from sentence_transformers.util.quantization import quantize_embeddings
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from batching.codecs.embed_options import (
    EmbedOptions,
    OptionError,
    plan_embedding,
    read_options,
)
from batching.errors import InvalidRequest
from batching.models.items import EmbedItem
from batching.settings.cli import parse_settings
from batching.settings.repository import RepositoryError, load_repository
from tests.support.asgi import serving
from tests.support.embedder import (
    DIM,
    MAX_SEQ,
    RANGES,
    OptionEmbedder,
    vector_of,
    words_of,
)
from tests.support.metrics import sample
from tests.support.models import EchoModel, VectorModel
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.anyio

SHORT = "a small cat"
LONG = "one two three four five six seven eight nine ten"  # over MAX_SEQ with any prompt
METADATA = OptionEmbedder().metadata()


def expected(prompt: str, text: str, left: bool = False) -> np.ndarray:
    return vector_of(words_of(prompt, text, left))


def tokens(prompt: str, text: str) -> int:
    return min(len((prompt + text).split()) + 2, MAX_SEQ)


def _builder(models: dict[str, Any]) -> Any:
    return lambda config: models[config.name]


def _configs() -> list[ModelConfig]:
    return [
        ModelConfig(name="opts", batching=BatchingConfig(max_batch_size=8)),
        ModelConfig(name="strict", truncate=False),
        ModelConfig(name="vectors"),
        ModelConfig(name="echo"),
    ]


def _models() -> dict[str, Any]:
    return {
        "opts": OptionEmbedder(),
        "strict": OptionEmbedder(),
        "vectors": VectorModel(),
        "echo": EchoModel(),
    }


# --- the parser ------------------------------------------------------------------------------


def test_options_are_read_with_their_types_and_unknown_ones_refused() -> None:
    options = read_options(
        {"prompt_name": "query", "truncate": False, "encoding": "int8+base64", "dimensions": 8},
        where="the request",
    )
    assert options == EmbedOptions(
        prompt_name="query", truncate=False, dimensions=8, encoding="int8", base64=True
    )
    with pytest.raises(OptionError, match="unknown option 'normalize'") as caught:
        read_options({"normalize": True}, where="the request")
    assert caught.value.param == "normalize"
    for bad in (
        {"truncate": "no"},
        {"dimensions": "8"},
        {"dimensions": 0},
        {"encoding": "fp16"},
        {"truncation_direction": "up"},
        {"prompt_name": 3},
    ):
        with pytest.raises(OptionError):
            read_options(bad, where="the request")


def test_the_default_options_send_plain_strings_and_any_other_sends_embed_items() -> None:
    plan = plan_embedding(["x"], EmbedOptions(prompt_name="query"), METADATA, model="m")
    assert plan.items == ["x"]  # the model's own default prompt: the fast path
    plan = plan_embedding(
        ["x"],
        EmbedOptions(input_type="search_document", truncation_direction="left"),
        METADATA,
        model="m",
    )
    assert plan.items == [EmbedItem("x", prompt="doc: ", truncate_left=True)]
    plan = plan_embedding(["x"], EmbedOptions(encoding="binary", dimensions=8), METADATA, model="m")
    assert plan.items == [EmbedItem("x", prompt="query: ", dimensions=8, encoding="binary")]
    with pytest.raises(InvalidRequest, match="'query', 'passage', 'document'"):
        plan_embedding(["x"], EmbedOptions(prompt_name="nope"), METADATA, model="m")
    with pytest.raises(InvalidRequest, match="different prompts"):
        plan_embedding(
            ["x"], EmbedOptions(prompt_name="query", input_type="document"), METADATA, model="m"
        )


def test_a_model_without_embedding_metadata_refuses_what_it_cannot_apply() -> None:
    metadata = VectorModel().metadata()
    for options in (
        EmbedOptions(prompt_name="query"),
        EmbedOptions(truncate=False),
        EmbedOptions(truncation_direction="right"),
        EmbedOptions(encoding="int8"),
    ):
        with pytest.raises(OptionError, match="declares no embedding options"):
            plan_embedding(["x"], options, metadata, model="vectors")
    plan = plan_embedding(["x"], EmbedOptions(base64=True), metadata, model="vectors")
    assert plan.items == ["x"]


# --- plain JSON and KServe v2 over HTTP, in-process -------------------------------------------


@pytest.fixture
async def http() -> Any:
    models = _models()
    app = create_app(_configs(), builder=_builder(models))
    async with serving(app) as client:
        yield client, models


async def test_plain_prompts_by_name_in_both_places_and_by_input_type(http: Any) -> None:
    client, models = http
    answer = await client.post("/models/opts", json={"inputs": [SHORT, LONG]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    np.testing.assert_allclose(body["outputs"][0], expected("query: ", SHORT), rtol=1e-6)
    assert body["truncated"] == [False, True]
    assert body["usage"]["prompt_tokens"] == tokens("query: ", SHORT) + MAX_SEQ
    for request in (
        {"inputs": [SHORT], "prompt_name": "passage"},
        {"inputs": [SHORT], "parameters": {"prompt_name": "passage"}},
        {"inputs": [SHORT], "input_type": "passage"},
    ):
        answer = await client.post("/models/opts", json=request)
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(
            answer.json()["outputs"][0], expected("passage: ", SHORT), rtol=1e-6
        )
        assert answer.json()["usage"]["prompt_tokens"] == tokens("passage: ", SHORT)
    assert models["opts"].items[-1] == EmbedItem(SHORT, prompt="passage: ")
    answer = await client.post("/models/opts", json={"inputs": [SHORT], "input_type": "document"})
    np.testing.assert_allclose(answer.json()["outputs"][0], expected("doc: ", SHORT), rtol=1e-6)


async def test_plain_unknown_options_and_prompts_are_400s_naming_them(http: Any) -> None:
    client, _ = http
    cases = [
        ("opts", {"inputs": ["x"], "prompt_name": "nope"}, "'query', 'passage', 'document'"),
        ("opts", {"inputs": ["x"], "normalize": False}, "'normalize'"),
        ("opts", {"inputs": ["x"], "parameters": {"top_k": 3}}, "'top_k'"),
        ("opts", {"inputs": ["x"], "truncate": "yes"}, "truncate"),
        ("opts", {"inputs": ["x"], "encoding": "fp16"}, "encoding"),
        ("vectors", {"inputs": ["x"], "prompt_name": "query"}, "prompt_name"),
        ("echo", {"inputs": ["x"], "truncate": False}, "not an embedding model"),
    ]
    for model, request, fragment in cases:
        answer = await client.post(f"/models/{model}", json=request)
        assert answer.status_code == 400, (request, answer.text)
        assert fragment in answer.json()["error"], answer.text


async def test_plain_truncation_is_counted_refused_on_request_and_cut_left(http: Any) -> None:
    client, models = http
    answer = await client.post("/models/opts", json={"inputs": [LONG], "truncate": False})
    assert answer.status_code == 413
    message = answer.json()["error"]
    assert f"limit of {MAX_SEQ} tokens" in message and "has 13 tokens" in message
    # The server-wide default (--no-truncate) refuses; a request may still ask for the cut.
    assert (await client.post("/models/strict", json={"inputs": [LONG]})).status_code == 413
    assert not models["strict"].items
    answer = await client.post("/models/strict", json={"inputs": [LONG], "truncate": True})
    assert answer.status_code == 200 and answer.json()["truncated"] == [True]
    answer = await client.post(
        "/models/opts", json={"inputs": [LONG], "truncation_direction": "left"}
    )
    np.testing.assert_allclose(
        answer.json()["outputs"][0], expected("query: ", LONG, left=True), rtol=1e-6
    )
    metrics = (await client.get("/metrics")).text
    assert sample(metrics, "batching_truncated_inputs_total", 0.0, model="opts") == 1
    assert sample(metrics, "batching_truncated_inputs_total", 0.0, model="strict") == 1
    # The two 413s are refusals at the edge, counted as a body over the limit is.
    assert sample(metrics, "batching_rejected_total", 0.0, model="opts", reason="too_large") == 1
    assert sample(metrics, "batching_rejected_total", 0.0, model="strict", reason="too_large") == 1


async def test_plain_encodings_equal_quantize_embeddings_with_the_shown_ranges(
    http: Any,
) -> None:
    client, models = http
    ranges = np.array(
        (await client.get("/v2/models/opts")).json()["embedding"]["quantization_ranges"]
    )
    float_vector = expected("query: ", SHORT)
    for encoding in ("int8", "uint8", "binary", "ubinary"):
        want = quantize_embeddings(float_vector[None], encoding, ranges=ranges)[0]
        answer = await client.post("/models/opts", json={"inputs": [SHORT], "encoding": encoding})
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0] == want.tolist()
        answer = await client.post(
            "/models/opts", json={"inputs": [SHORT], "encoding": f"{encoding}+base64"}
        )
        assert base64.b64decode(answer.json()["outputs"][0]) == want.tobytes()
    answer = await client.post("/models/opts", json={"inputs": [SHORT], "encoding": "base64"})
    decoded = np.frombuffer(base64.b64decode(answer.json()["outputs"][0]), dtype="<f4")
    np.testing.assert_allclose(decoded, float_vector, rtol=1e-6)
    # dimensions composes: shortened (and re-normalised) before quantizing, by the model.
    short = vector_of(words_of("query: ", SHORT), 8)
    answer = await client.post(
        "/models/opts", json={"inputs": [SHORT], "encoding": "int8", "dimensions": 8}
    )
    assert (
        answer.json()["outputs"][0]
        == quantize_embeddings(short[None], "int8", ranges=ranges[:, :8])[0].tolist()
    )
    assert models["opts"].items[-1].dimensions == 8
    # For float vectors the door shortens, on models with and without embedding metadata.
    answer = await client.post("/models/opts", json={"inputs": [SHORT], "dimensions": 8})
    np.testing.assert_allclose(answer.json()["outputs"][0], short, rtol=1e-6)
    answer = await client.post("/models/vectors", json={"inputs": ["x"], "dimensions": 4})
    assert answer.status_code == 200
    answer = await client.post("/models/opts", json={"inputs": [SHORT], "dimensions": DIM + 1})
    assert answer.status_code == 400


async def test_v2_json_takes_options_as_parameters_and_reports_truncation(http: Any) -> None:
    client, _ = http

    def infer(parameters: dict[str, Any], model: str = "opts") -> Any:
        body = {
            "inputs": [
                {"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": [SHORT, LONG]}
            ],
            "parameters": parameters,
        }
        return client.post(f"/v2/models/{model}/infer", json=body)

    answer = await infer({"prompt_name": "passage", "encoding": "ubinary"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    output = body["outputs"][0]
    assert (output["datatype"], output["shape"]) == ("UINT8", [2, DIM // 8])
    assert body["parameters"] == {
        "truncated": True,
        "truncated_inputs": "1",
        "prompt_tokens": tokens("passage: ", SHORT) + MAX_SEQ,
    }
    answer = await infer({"priority": 1, "timeout": 5_000_000, "encoding": "int8"})
    assert answer.json()["outputs"][0]["datatype"] == "INT8"
    for parameters, fragment in (
        ({"normalize": True}, "'normalize'"),
        ({"prompt_name": "nope"}, "'query'"),
    ):
        answer = await infer(parameters)
        assert answer.status_code == 400 and fragment in answer.json()["error"]
    answer = await infer({"truncate": False})
    assert answer.status_code == 413
    config = (await client.get("/v2/models/strict/config")).json()["parameters"]
    assert config["truncate"] == {"string_value": "false"}
    assert orjson.loads(config["embedding"]["string_value"]) == METADATA["embedding"]
    # The output's own parameters may carry its encoding and dimensions; nothing else new.
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [SHORT]}],
        "outputs": [{"name": "embedding", "parameters": {"encoding": "uint8", "dimensions": 8}}],
    }
    answer = await client.post("/v2/models/opts/infer", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["datatype"] == "UINT8"
    assert answer.json()["outputs"][0]["shape"] == [1, 8]
    body["outputs"][0]["parameters"] = {"precision": "int8"}  # type: ignore[index]
    answer = await client.post("/v2/models/opts/infer", json=body)
    assert answer.status_code == 400 and "'precision'" in answer.json()["error"]
    echo_body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
        "parameters": {"custom": 1},
    }
    answer = await client.post("/v2/models/echo/infer", json=echo_body)
    assert answer.status_code == 400 and "'custom'" in answer.json()["error"]


# --- the SDK and Triton's clients against a real server ---------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, str, dict[str, Any]]]:
    models = _models()
    port = free_port()
    app = create_app(_configs(), builder=_builder(models), grpc_port=port)
    with serving_in_thread(app) as url:
        yield url, f"127.0.0.1:{port}", models


def test_openai_sdk_sends_options_in_extra_body_and_reads_truncated(
    server: tuple[str, str, dict[str, Any]],
) -> None:
    url, _, models = server
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as sdk:
        response = sdk.embeddings.create(
            model="opts", input=[SHORT, LONG], extra_body={"prompt_name": "passage"}
        )
        vectors = np.array([item.embedding for item in response.data], dtype=np.float32)
        np.testing.assert_allclose(vectors[0], expected("passage: ", SHORT), rtol=1e-6)
        assert [item.model_extra["truncated"] for item in response.data] == [False, True]
        assert response.usage.prompt_tokens == tokens("passage: ", SHORT) + MAX_SEQ

        response = sdk.embeddings.create(
            model="opts",
            input=[SHORT],
            encoding_format="int8",  # type: ignore[arg-type]
            extra_body={"input_type": "query"},
        )
        want = quantize_embeddings(expected("query: ", SHORT)[None], "int8", ranges=RANGES)[0]
        assert response.data[0].embedding == want.tolist()

        with pytest.raises(openai.BadRequestError) as caught:
            sdk.embeddings.create(model="opts", input=[SHORT], extra_body={"prompt": "x: "})
        assert caught.value.body["param"] == "prompt"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.embeddings.create(
                model="vectors",
                input=["x"],
                encoding_format="ubinary",  # type: ignore[arg-type]
            )
        assert caught.value.body["param"] == "encoding_format"  # type: ignore[index]
        with pytest.raises(openai.APIStatusError) as status:
            sdk.embeddings.create(model="opts", input=[LONG], extra_body={"truncate": False})
        assert status.value.status_code == 413
    answer = httpx.post(
        f"{url}/v1/embeddings",
        json={"model": "opts", "input": SHORT, "encoding_format": "binary+base64"},
    )
    want = quantize_embeddings(expected("query: ", SHORT)[None], "binary", ranges=RANGES)[0]
    assert base64.b64decode(answer.json()["data"][0]["embedding"]) == want.tobytes()
    assert models["opts"].items[-1].encoding == "binary"


def test_tritonclient_http_sends_options_as_parameters(
    server: tuple[str, str, dict[str, Any]],
) -> None:
    url, _, _ = server
    client = triton_http.InferenceServerClient(url.removeprefix("http://"))
    text = triton_http.InferInput("text", [2, 1], "BYTES")
    text.set_data_from_numpy(np.array([[SHORT], [LONG]], dtype=object))
    result = client.infer(
        "opts", [text], parameters={"truncation_direction": "left", "encoding": "float"}
    )
    vectors = result.as_numpy("embedding")
    np.testing.assert_allclose(vectors[1], expected("query: ", LONG, left=True), rtol=1e-6)
    assert result.get_response()["parameters"]["truncated_inputs"] == "1"
    result = client.infer("opts", [text], parameters={"encoding": "binary"})
    packed = result.as_numpy("embedding")
    assert packed.dtype == np.int8 and packed.shape == (2, DIM // 8)
    with pytest.raises(InferenceServerException, match="unknown option 'k'"):
        client.infer("opts", [text], parameters={"k": 1})
    client.close()


def test_tritonclient_grpc_sends_options_as_parameters(
    server: tuple[str, str, dict[str, Any]],
) -> None:
    _, target, models = server
    client = triton_grpc.InferenceServerClient(target)
    text = triton_grpc.InferInput("text", [2, 1], "BYTES")
    text.set_data_from_numpy(np.array([[SHORT], [LONG]], dtype=object))
    result = client.infer(
        "opts", [text], parameters={"prompt_name": "document", "encoding": "uint8"}
    )
    vectors = result.as_numpy("embedding")
    want = quantize_embeddings(expected("doc: ", SHORT)[None], "uint8", ranges=RANGES)[0]
    assert vectors.dtype == np.uint8 and vectors[0].tolist() == want.tolist()
    parameters = result.get_response().parameters
    assert parameters["truncated"].bool_param is True
    assert parameters["prompt_tokens"].int64_param == tokens("doc: ", SHORT) + MAX_SEQ
    assert models["opts"].items[-2] == EmbedItem(SHORT, prompt="doc: ", encoding="uint8")
    for options, fragment in (
        ({"truncate": False}, f"limit of {MAX_SEQ} tokens"),
        ({"prompt_name": "nope"}, "'passage'"),
        ({"dimensions": 0}, "dimensions"),
        ({"normalize": True}, "'normalize'"),
    ):
        with pytest.raises(InferenceServerException) as caught:
            client.infer("opts", [text], parameters=options)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert fragment in str(caught.value.message())
    client.close()


# --- the server-wide default -------------------------------------------------------------------


def test_no_truncate_is_a_flag_a_variable_and_a_repository_key(tmp_path: Path) -> None:
    assert parse_settings([], environ={}).models[0].truncate is True
    assert parse_settings(["--no-truncate"], environ={}).models[0].truncate is False
    env = {"BATCHING_NO_TRUNCATE": "1"}
    assert parse_settings([], environ=env).models[0].truncate is False
    with pytest.raises(SystemExit, match="BATCHING_NO_TRUNCATE"):
        parse_settings([], environ={"BATCHING_NO_TRUNCATE": "maybe"})
    file = tmp_path / "models.toml"
    file.write_text(
        '[models.cut]\nsource = "tests.support.models:EchoModel"\n'
        '[models.whole]\nsource = "tests.support.models:EchoModel"\ntruncate = false\n',
        encoding="utf-8",
    )
    cut, whole = load_repository(file)
    assert (cut.truncate, whole.truncate) == (True, False)
    # The command line's default is every model's that sets none.
    cut, whole = load_repository(file, defaults=ModelConfig(name="x", truncate=False))
    assert (cut.truncate, whole.truncate) == (False, False)
    file.write_text(
        '[models.bad]\nsource = "tests.support.models:EchoModel"\ntruncate = "no"\n',
        encoding="utf-8",
    )
    with pytest.raises(RepositoryError, match="truncate"):
        load_repository(file)
