"""zero-shot-classification through every door on a real server (plain JSON, KServe v2 over
HTTP and gRPC with tritonclient): candidate labels as request parameters, answers equal to
``transformers.pipeline("zero-shot-classification")``, concurrent requests packed into shared
batches, and every kind of bad input a 4xx with a JSON body."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import transformers
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.asgi import serving
from tests.support.metrics import sample
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread
from tests.support.tiny import classifier_folder

TASK = "zero-shot-classification"
TEXTS = ["the cat sat on the mat", "i like it", "a red house with a green tree"]
LABELS = ["cat", "dog", "red house", "fish", "good movie", "tree", "blue"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("nli")
    return classifier_folder(root, "nli", ["contradiction", "neutral", "entailment"], seed=11)


@pytest.fixture(scope="module")
def reference(folder: Path) -> Any:
    return transformers.pipeline(TASK, model=str(folder), device="cpu")


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[tuple[str, str]]:
    """The base URL and the gRPC target of one server for the module."""
    config = ModelConfig(
        name="zs",
        source=str(folder),
        task=TASK,
        batching=BatchingConfig(max_batch_size=64, max_queue_delay=0.05),
        engine="torch",
        precision="fp32",
    )
    port = free_port()
    with serving_in_thread(create_app(config, grpc_port=port)) as url:
        yield url, f"127.0.0.1:{port}"


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["sequence"] == want["sequence"]
    assert got["labels"] == want["labels"]
    assert got["scores"] == pytest.approx(want["scores"], abs=1e-4)


def text_input(module: Any, texts: list[str]) -> Any:
    tensor = module.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1))
    return tensor


def answers_of(result: Any) -> list[dict[str, Any]]:
    return [json.loads(row) for row in result.as_numpy("output").reshape(-1)]


# -- answers ---------------------------------------------------------------------------------


def test_the_v2_metadata_lists_the_parameters(server: tuple[str, str]) -> None:
    described = httpx.get(f"{server[0]}/v2/models/zs").json()
    assert described["parameters"]["candidate_labels"]["required"] is True
    assert described["parameters"]["hypothesis_template"]["default"] == "This example is {}."
    assert described["parameters"]["multi_label"]["type"] == "boolean"


@pytest.mark.parametrize("multi_label", [False, True])
def test_the_plain_door_answers_as_the_pipeline(
    server: tuple[str, str], reference: Any, multi_label: bool
) -> None:
    parameters = {"candidate_labels": LABELS[:4], "multi_label": multi_label}
    response = httpx.post(
        f"{server[0]}/models/zs", json={"inputs": TEXTS, "parameters": parameters}, timeout=30
    )
    assert response.status_code == 200, response.text
    for text, got in zip(TEXTS, response.json()["outputs"], strict=True):
        assert_same(got, reference(text, **parameters))


def test_the_v2_http_door_answers_as_the_pipeline(server: tuple[str, str], reference: Any) -> None:
    client = triton_http.InferenceServerClient(server[0].removeprefix("http://"))
    template = "it is about {}"
    try:
        result = client.infer(
            "zs",
            [text_input(triton_http, TEXTS)],
            parameters={"candidate_labels": LABELS, "hypothesis_template": template},
        )
    finally:
        client.close()
    for text, got in zip(TEXTS, answers_of(result), strict=True):
        assert_same(got, reference(text, candidate_labels=LABELS, hypothesis_template=template))


def test_the_grpc_door_answers_as_the_pipeline(server: tuple[str, str], reference: Any) -> None:
    client = triton_grpc.InferenceServerClient(server[1])
    try:
        # gRPC parameters are scalars: a list travels as a JSON array in a string.
        result = client.infer(
            "zs",
            [text_input(triton_grpc, TEXTS)],
            parameters={"candidate_labels": json.dumps(LABELS[2:]), "multi_label": True},
        )
    finally:
        client.close()
    for text, got in zip(TEXTS, answers_of(result), strict=True):
        assert_same(got, reference(text, candidate_labels=LABELS[2:], multi_label=True))


def test_16_concurrent_requests_share_batches_and_equal_their_single_answers(
    server: tuple[str, str],
) -> None:
    url = server[0]
    requests = [
        {
            "inputs": [TEXTS[i % len(TEXTS)]],
            "parameters": {
                "candidate_labels": LABELS[i % 5 : i % 5 + 1 + i % 3],
                "multi_label": i % 2 == 0,
            },
        }
        for i in range(16)
    ]

    async def post(client: httpx.AsyncClient, body: dict[str, Any]) -> Any:
        response = await client.post("/models/zs", json=body)
        assert response.status_code == 200, response.text
        return response.json()["outputs"][0]

    async def all_at_once() -> list[Any]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            return list(await asyncio.gather(*(post(client, body) for body in requests)))

    before = httpx.get(f"{url}/metrics").text
    together = asyncio.run(all_at_once())
    after = httpx.get(f"{url}/metrics").text
    with httpx.Client(base_url=url, timeout=30) as client:
        for body, got in zip(requests, together, strict=True):
            single = client.post("/models/zs", json=body)
            assert single.status_code == 200
            assert_same(got, single.json()["outputs"][0])

    def grown(name: str, **labels: str) -> float:
        return sample(after, name, 0.0, model="zs", **labels) - sample(
            before, name, 0.0, model="zs", **labels
        )

    family = "batching_batch_size_items"
    pairs = sum(len(body["parameters"]["candidate_labels"]) for body in requests)
    assert grown(f"{family}_sum") == pairs  # one unit of batching per (text, label) pair
    batches = grown(f"{family}_count")
    assert batches < len(requests)  # pairs of several requests shared batches
    assert batches - grown(f"{family}_bucket", le="1.0") >= 1  # a batch over 1


# -- bad input -------------------------------------------------------------------------------

BAD = [
    pytest.param({}, "candidate_labels", id="no-labels"),
    pytest.param({"candidate_labels": [1, 2]}, "candidate_labels", id="labels-not-strings"),
    pytest.param(
        {"candidate_labels": ["a"], "hypothesis_template": "no slot"},
        "hypothesis_template",
        id="bad-template",
    ),
    pytest.param({"candidate_labels": ["a"], "top_k": 2}, "top_k", id="unknown-parameter"),
]


@pytest.mark.parametrize(("parameters", "named"), BAD)
def test_bad_input_is_a_400_with_a_json_body_on_the_plain_door(
    server: tuple[str, str], parameters: dict[str, Any], named: str
) -> None:
    body: dict[str, Any] = {"inputs": ["i like it"]}
    if parameters:
        body["parameters"] = parameters
    response = httpx.post(f"{server[0]}/models/zs", json=body, timeout=30)
    assert response.status_code == 400
    assert named in response.json()["error"]


@pytest.mark.parametrize(("parameters", "named"), BAD)
def test_bad_input_is_a_400_with_a_json_body_on_the_v2_http_door(
    server: tuple[str, str], parameters: dict[str, Any], named: str
) -> None:
    body: dict[str, Any] = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["i like it"]}]
    }
    if parameters:
        body["parameters"] = parameters
    response = httpx.post(f"{server[0]}/v2/models/zs/infer", json=body, timeout=30)
    assert response.status_code == 400
    assert named in response.json()["error"]
    client = triton_http.InferenceServerClient(server[0].removeprefix("http://"))
    try:
        with pytest.raises(InferenceServerException, match=named) as refused:
            client.infer("zs", [text_input(triton_http, ["i like it"])], parameters=parameters)
    finally:
        client.close()
    assert refused.value.status() == "400"


@pytest.mark.parametrize(("parameters", "named"), BAD)
def test_bad_input_is_invalid_argument_on_the_grpc_door(
    server: tuple[str, str], parameters: dict[str, Any], named: str
) -> None:
    sent = {
        key: json.dumps(value) if isinstance(value, list) else value
        for key, value in parameters.items()
    }
    client = triton_grpc.InferenceServerClient(server[1])
    try:
        with pytest.raises(InferenceServerException, match=named) as refused:
            client.infer("zs", [text_input(triton_grpc, ["i like it"])], parameters=sent)
    finally:
        client.close()
    assert refused.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)


def test_more_pairs_than_a_request_may_carry_is_a_413(server: tuple[str, str]) -> None:
    labels = [f"label {i}" for i in range(1025)]  # the default --max-items-per-request: 1024
    body = {"inputs": ["i like it"], "parameters": {"candidate_labels": labels}}
    response = httpx.post(f"{server[0]}/models/zs", json=body, timeout=30)
    assert response.status_code == 413
    assert "1024" in response.json()["error"]


@pytest.mark.anyio
async def test_the_repository_defaults_apply_and_a_request_overrides_them(
    folder: Path, reference: Any
) -> None:
    config = ModelConfig(
        name="fixed",
        source=str(folder),
        task=TASK,
        engine="torch",
        precision="fp32",
        parameters=(("candidate_labels", ("cat", "dog")), ("multi_label", True)),
    )
    async with serving(create_app(config)) as client:
        response = await client.post("/", json={"inputs": [TEXTS[0]]})
        assert response.status_code == 200, response.text
        want = reference(TEXTS[0], candidate_labels=["cat", "dog"], multi_label=True)
        assert_same(response.json()["outputs"][0], want)
        asked = {"candidate_labels": ["fish"], "multi_label": False}
        response = await client.post("/", json={"inputs": [TEXTS[0]], "parameters": asked})
        assert_same(response.json()["outputs"][0], reference(TEXTS[0], **asked))
