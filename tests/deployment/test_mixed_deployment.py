"""A deployment as operators run one: an embedder, a cross-encoder, a sparse encoder, a
text-generation model and an image classifier in one server, with an API key and TLS on both
ports, answering through every door with the clients people use: the plain door (httpx),
KServe v2 over HTTP and gRPC (tritonclient), the OpenAI doors (the ``openai`` SDK, streaming
included), ``/v1/rerank`` and ``/embed_sparse``. ``/v1/models`` lists each model with what it
serves, and the repository index says what memory each took."""

from __future__ import annotations

import json
import queue
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.support.repositories import mixed_repository
from tests.support.server_process import ServerProcess
from tests.support.tls import Pki, make_pki
from tests.support.vision import png

pytestmark = pytest.mark.slow

KEY = "mixed-deployment-key"
MODELS = ("embedder", "reranker", "splade", "writer", "vision")
IMAGE = png(40, 30, seed=1)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    repository = mixed_repository(tmp_path_factory.mktemp("mixed"), MODELS)
    flags = ["--api-key", KEY, "--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(pki.key)]
    process = ServerProcess(*flags, model=["--model-repository", str(repository)], ready_s=110)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def context(pki: Pki) -> ssl.SSLContext:
    return pki.client_context()


@pytest.fixture
def http(server: ServerProcess, context: ssl.SSLContext) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.url, verify=context, headers=headers, timeout=60) as client:
        yield client


@pytest.fixture
def sdk(server: ServerProcess, context: ssl.SSLContext) -> Iterator[openai.OpenAI]:
    with httpx.Client(verify=context, timeout=60) as pooled:
        yield openai.OpenAI(
            base_url=f"{server.url}/v1", api_key=KEY, http_client=pooled, max_retries=0
        )


# -- the plain door -------------------------------------------------------------------------


def test_the_plain_door_answers_every_model(http: httpx.Client) -> None:
    vector = http.post("/models/embedder", content="some text").json()["outputs"][0]
    assert len(vector) == 384
    pair = {"inputs": [{"text": "a cat", "text_pair": "a cat sat"}]}
    score = http.post("/models/reranker", json=pair).json()["outputs"][0]
    assert isinstance(score, (dict, list, float))
    sparse = http.post("/models/splade", json={"inputs": ["a cat"]}).json()["outputs"][0]
    assert len(sparse["indices"]) == len(sparse["values"]) > 0
    written = http.post("/models/writer", json={"inputs": ["the cat"]}).json()["outputs"][0]
    assert written["generated_text"].startswith("the cat")
    labels = http.post(
        "/models/vision", content=IMAGE, headers={"Content-Type": "image/png"}
    ).json()["outputs"][0]
    assert labels and {"label", "score"} <= set(labels[0])


def test_the_plain_door_refuses_a_wrong_key_for_every_model(
    server: ServerProcess, context: ssl.SSLContext
) -> None:
    with httpx.Client(base_url=server.url, verify=context) as client:
        for name in MODELS:
            answer = client.post(f"/models/{name}", content="x", headers={"Authorization": "no"})
            assert answer.status_code == 401, name


# -- KServe v2 over HTTP and gRPC, with tritonclient ---------------------------------------


def _texts(module: Any, name: str, texts: list[str]) -> Any:
    tensor = module.InferInput(name, [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object).reshape(-1, 1))
    return tensor


def _requests(module: Any) -> dict[str, tuple[list[Any], str]]:
    return {
        "embedder": ([_texts(module, "text", ["a", "b"])], "embedding"),
        "reranker": (
            [_texts(module, "text", ["a cat"]), _texts(module, "text_pair", ["a cat sat"])],
            "output",
        ),
        "splade": ([_texts(module, "text", ["a cat"])], "values"),
        "writer": ([_texts(module, "text", ["the cat"])], "output"),
        "vision": ([_image(module)], "output"),
    }


def _image(module: Any) -> Any:
    tensor = module.InferInput("image", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([IMAGE], dtype=object).reshape(1, 1))
    return tensor


def _check(name: str, output: np.ndarray) -> None:
    if name == "embedder":
        assert output.shape == (2, 384)
    elif name == "splade":
        assert output.shape[0] == 1 and float(np.max(output)) > 0
    elif name == "writer":
        assert json.loads(output.reshape(-1)[0])["generated_text"].startswith("the cat")
    else:
        assert output.shape[0] == 1 and json.loads(output.reshape(-1)[0])


def test_tritonclient_http_infers_with_every_model_over_tls(
    server: ServerProcess, pki: Pki
) -> None:
    client = triton_http.InferenceServerClient(
        server.url.removeprefix("https://"), ssl=True, ssl_options={"ca_certs": str(pki.ca)}
    )
    headers = {"Authorization": f"Bearer {KEY}"}
    try:
        for name, (inputs, output) in _requests(triton_http).items():
            result = client.infer(name, inputs, headers=headers)
            _check(name, np.asarray(result.as_numpy(output)))
        with pytest.raises(InferenceServerException, match="401|nauthori"):
            client.infer("embedder", _requests(triton_http)["embedder"][0])
    finally:
        client.close()


def test_tritonclient_grpc_infers_and_streams_with_every_model_over_tls(
    server: ServerProcess, pki: Pki
) -> None:
    client = triton_grpc.InferenceServerClient(
        server.grpc_target, ssl=True, root_certificates=str(pki.ca)
    )
    headers = {"authorization": f"Bearer {KEY}"}
    try:
        for name, (inputs, output) in _requests(triton_grpc).items():
            result = client.infer(name, inputs, headers=headers)
            _check(name, np.asarray(result.as_numpy(output)))
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED|nauthenti"):
            client.infer("vision", [_image(triton_grpc)])
        results: queue.Queue[Any] = queue.Queue()
        client.start_stream(
            callback=lambda result, error: results.put((result, error)), headers=headers
        )
        tensor = triton_grpc.InferInput("text", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b"the cat"], dtype=object))
        client.async_stream_infer("writer", [tensor], request_id="s1")
        pieces = []
        while True:
            result, error = results.get(timeout=60)
            assert error is None, error
            output = result.as_numpy("text_output")
            if output is not None:
                pieces.append(output[0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
        assert pieces
    finally:
        client.close()


# -- the OpenAI doors, with the openai SDK ---------------------------------------------------


def test_the_openai_sdk_embeds_completes_chats_and_streams(sdk: openai.OpenAI) -> None:
    vectors = sdk.embeddings.create(model="embedder", input=["a", "b"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 384
    completion = sdk.completions.create(model="writer", prompt="the cat", max_tokens=4)
    assert completion.choices[0].text and completion.usage is not None
    streamed = sdk.completions.create(
        model="writer",
        prompt="the cat",
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(streamed)
    text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert text == completion.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    chat = sdk.chat.completions.create(
        model="writer", messages=[{"role": "user", "content": "the cat"}], max_tokens=3
    )
    assert chat.choices[0].message.content is not None
    with pytest.raises(openai.NotFoundError):
        sdk.embeddings.create(model="writer", input="not an embedder")


def test_rerank_and_sparse_doors_answer_their_models(http: httpx.Client) -> None:
    ranked = http.post(
        "/v1/rerank", json={"model": "reranker", "query": "cat", "documents": ["a cat", "dog"]}
    )
    assert ranked.status_code == 200, ranked.text
    sparse = http.post("/embed_sparse", json={"inputs": "a cat", "model": "splade"})
    assert sparse.status_code == 200, sparse.text


def test_v1_models_lists_every_model_with_what_it_serves(sdk: openai.OpenAI) -> None:
    listed = {model.id: model for model in sdk.models.list()}
    assert set(listed) == set(MODELS)
    extra = {name: model.model_extra or {} for name, model in listed.items()}
    assert "/v1/embeddings" in extra["embedder"]["endpoints"]
    assert "/v1/chat/completions" in extra["writer"]["endpoints"]
    assert "/v1/completions" in extra["writer"]["endpoints"]
    assert "/v1/rerank" in extra["reranker"]["endpoints"]
    assert "/embed_sparse" in extra["splade"]["endpoints"]
    assert extra["writer"]["task"] == "text-generation"
    assert extra["vision"]["task"] == "image-classification"
    assert extra["embedder"]["max_model_len"] == 256
    assert extra["writer"]["max_model_len"] > 0
    for name in MODELS:
        assert f"/v2/models/{name}/infer" in extra[name]["endpoints"]
        assert sdk.models.retrieve(name).id == name


def test_the_index_says_each_models_memory(http: httpx.Client) -> None:
    index = http.post("/v2/repository/index").json()
    assert {entry["name"] for entry in index} == set(MODELS)
    for entry in index:
        assert entry["state"] == "READY"
        assert entry["memory_mb"] >= 0
    metrics = http.get("/metrics").text
    assert 'batching_model_memory_bytes{model="embedder"}' in metrics
