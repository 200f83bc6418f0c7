"""The OpenAI-compatible door (``/v1/embeddings``, ``/v1/models``), driven by the official
``openai`` SDK against a real socket, on tiny offline models."""

from __future__ import annotations

import base64
import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import transformers

import batching.core.admission
from batching import BatchingConfig, ModelConfig, create_app
from batching.app import default_model_builder
from batching.codecs.openai import MAX_INPUT_TOKENS, MAX_INPUTS, MAX_REQUEST_TOKENS
from tests.support.asgi import app_with
from tests.support.metrics import sample
from tests.support.models import GatedModel, VectorModel
from tests.support.threaded import serving_in_thread
from tests.support.tiny import (
    HIDDEN,
    ST_MAX_SEQ,
    classifier_folder,
    encoder_folder,
    sentence_folder,
)

TEXTS = ["the cat sat on the mat", "a dog", "very good movie", "i like it"]
ERROR_KEYS = {"message", "type", "param", "code"}


class PickyVectors(VectorModel):
    """A custom embedder that counts tokens its own way, and cannot tokenize "boom"."""

    def count_tokens(self, item: Any) -> int:
        if item == "boom":
            raise ValueError("no token for boom")
        return len(str(item).split()) + 2


class GatedVectors(GatedModel, VectorModel):
    """A custom embedder that blocks in ``predict`` until the test opens its gate."""


def _builder(config: ModelConfig) -> Any:
    if config.name == "picky":
        return PickyVectors()
    return default_model_builder(config)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        "st": sentence_folder(root),
        "base": encoder_folder(root),
        "classifier": classifier_folder(root, "classifier", ["NEG", "POS"]),
    }


@pytest.fixture(scope="module")
def url(folders: dict[str, Path]) -> Iterator[str]:
    models = [
        ModelConfig(
            name="st", source=str(folders["st"]), batching=BatchingConfig(max_batch_size=8)
        ),
        ModelConfig(name="fe", source=str(folders["base"]), task="feature-extraction"),
        ModelConfig(
            name="classifier", source=str(folders["classifier"]), task="text-classification"
        ),
        ModelConfig(name="vectors", source="tests.support.models:VectorModel"),
        ModelConfig(name="picky", source="tests.support.models:VectorModel"),
    ]
    with serving_in_thread(create_app(models, builder=_builder)) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as sdk:
        yield sdk


def plain_vectors(url: str, model: str, texts: list[str]) -> np.ndarray:
    answer = httpx.post(f"{url}/models/{model}", json={"inputs": texts})
    assert answer.status_code == 200, answer.text
    return np.array(answer.json()["outputs"], dtype=np.float32)


def sdk_vectors(response: Any) -> np.ndarray:
    assert [item.index for item in response.data] == list(range(len(response.data)))
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def st_tokens(folder: Path, texts: list[str]) -> int:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    return sum(
        len(tokenizer(text, truncation=True, max_length=ST_MAX_SEQ)["input_ids"]) for text in texts
    )


def openai_error(answer: httpx.Response, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    document = answer.json()
    assert set(document) == {"error"}
    assert set(document["error"]) == ERROR_KEYS
    assert isinstance(document["error"]["message"], str) and document["error"]["message"]
    error: dict[str, Any] = document["error"]
    return error


def requests_counted(url: str, model: str, code: int) -> float:
    metrics = httpx.get(f"{url}/metrics").text
    return sample(metrics, "batching_requests_total", 0.0, model=model, code=str(code))


# --- embeddings through the SDK --------------------------------------------------------------


def test_sdk_vectors_equal_the_plain_routes_in_base64_and_float(
    url: str, client: openai.OpenAI, folders: dict[str, Path]
) -> None:
    plain = plain_vectors(url, "st", TEXTS)
    default = client.embeddings.create(model="st", input=TEXTS)  # base64 on the wire
    floats = client.embeddings.create(model="st", input=TEXTS, encoding_format="float")
    np.testing.assert_array_equal(sdk_vectors(default), plain)
    np.testing.assert_array_equal(sdk_vectors(floats), plain)
    assert default.model == "st" and default.object == "list"
    assert (
        default.usage.prompt_tokens == default.usage.total_tokens == st_tokens(folders["st"], TEXTS)
    )
    assert floats.usage == default.usage


def test_the_sdks_default_asks_for_base64_and_gets_little_endian_float32(
    url: str, client: openai.OpenAI
) -> None:
    raw = client.embeddings.with_raw_response.create(model="st", input="the cat sat")
    wire = raw.http_response.json()["data"][0]["embedding"]
    assert isinstance(wire, str)
    decoded = np.frombuffer(base64.b64decode(wire), dtype="<f4")
    np.testing.assert_array_equal(decoded, plain_vectors(url, "st", ["the cat sat"])[0])
    by_hand = httpx.post(
        f"{url}/v1/embeddings", json={"model": "st", "input": "the cat sat"}
    ).json()  # no encoding_format: float
    assert isinstance(by_hand["data"][0]["embedding"], list)
    assert by_hand["usage"] == {"prompt_tokens": 5, "total_tokens": 5}


def test_a_pipeline_embedder_and_a_custom_one_are_served(url: str, client: openai.OpenAI) -> None:
    fe = client.embeddings.create(model="fe", input=TEXTS)
    np.testing.assert_array_equal(sdk_vectors(fe), plain_vectors(url, "fe", TEXTS))
    assert sdk_vectors(fe).shape == (len(TEXTS), HIDDEN)
    custom = client.embeddings.create(model="vectors", input=["ab", "c"])
    np.testing.assert_array_equal(
        sdk_vectors(custom), np.array([[2, 97, 1, -1], [1, 99, 1, -1]], dtype=np.float32)
    )
    assert custom.usage.prompt_tokens == 0  # a custom model without count_tokens
    picky = client.embeddings.create(model="picky", input=["a b c", "d"])
    assert picky.usage.prompt_tokens == picky.usage.total_tokens == (3 + 2) + (1 + 2)


def test_long_inputs_are_truncated_at_the_models_length(url: str, client: openai.OpenAI) -> None:
    long = " ".join(["the cat sat on the mat"] * 20)  # 120 words, the model takes 16 tokens
    response = client.embeddings.create(model="st", input=[long], encoding_format="float")
    np.testing.assert_array_equal(sdk_vectors(response), plain_vectors(url, "st", [long]))
    assert response.usage.prompt_tokens == ST_MAX_SEQ


def test_dimensions_shortens_and_renormalises_unit_vectors(url: str, client: openai.OpenAI) -> None:
    full = plain_vectors(url, "st", TEXTS)
    short = sdk_vectors(client.embeddings.create(model="st", input=TEXTS, dimensions=8))
    assert short.shape == (len(TEXTS), 8)
    expected = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1.0, atol=1e-6)
    same = sdk_vectors(client.embeddings.create(model="st", input=TEXTS, dimensions=HIDDEN))
    np.testing.assert_array_equal(same, full)


def test_dimensions_is_a_clear_400_where_it_means_nothing(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as unnormalised:
        client.embeddings.create(model="fe", input="the cat", dimensions=8)
    assert unnormalised.value.code == "dimensions_not_supported"
    assert unnormalised.value.param == "dimensions"
    assert "normalise" in unnormalised.value.message
    # The model's own width is no change at all, so it is fine even there.
    full = client.embeddings.create(model="fe", input="the cat", dimensions=HIDDEN)
    assert len(full.data[0].embedding) == HIDDEN
    with pytest.raises(openai.BadRequestError) as wider:
        client.embeddings.create(model="st", input="the cat", dimensions=HIDDEN + 1)
    assert wider.value.param == "dimensions"
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="st", input="the cat", dimensions=0)


@pytest.mark.parametrize("ids", [[101, 2003, 102], [[101, 2003], [102]], ["text", [1, 2]]])
def test_token_id_arrays_are_refused_with_the_langchain_hint(
    client: openai.OpenAI, ids: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="st", input=ids)
    assert refused.value.code == "token_ids_not_supported"
    assert refused.value.param == "input"
    assert "check_embedding_ctx_length=False" in refused.value.message
    assert "token ids" in refused.value.message


def test_models_lists_every_model_and_the_embedders_serve_embeddings(
    client: openai.OpenAI,
) -> None:
    listed = {model.id: model.model_extra or {} for model in client.models.list()}
    assert set(listed) == {"st", "fe", "classifier", "vectors", "picky"}
    embedders = {name for name, extra in listed.items() if "/v1/embeddings" in extra["endpoints"]}
    assert embedders == {"st", "fe", "vectors", "picky"}  # not the classifier
    assert listed["classifier"]["task"] == "text-classification"
    assert listed["st"]["max_model_len"] > 0
    assert client.models.retrieve("st").id == "st"
    assert client.models.retrieve("classifier").id == "classifier"
    with pytest.raises(openai.NotFoundError) as unknown:
        client.models.retrieve("nope")
    assert unknown.value.code == "model_not_found"


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"model": "nope", "input": "x"}, 404, "model", "model_not_found"),
        ({"model": "classifier", "input": "x"}, 404, "model", "model_not_found"),
        ({"input": "x"}, 400, "model", "missing_required_parameter"),
        ({"model": "st"}, 400, "input", "missing_required_parameter"),
        ({"model": "st", "input": ""}, 400, "input", "invalid_value"),
        ({"model": "st", "input": []}, 400, "input", "invalid_value"),
        ({"model": "st", "input": ["a", ""]}, 400, "input", "invalid_value"),
        ({"model": "st", "input": ["a", None]}, 400, "input", "invalid_type"),
        ({"model": "st", "input": {"text": "a"}}, 400, "input", "invalid_type"),
        ({"model": "st", "input": ["a"] * (MAX_INPUTS + 1)}, 400, "input", "too_many_inputs"),
        ({"model": "st", "input": "a", "encoding_format": "fp16"}, 400, "encoding_format", None),
        ({"model": "st", "input": "a", "dimensions": "8"}, 400, "dimensions", "invalid_value"),
        ({"model": "picky", "input": ["fine", "boom"]}, 422, None, "unprocessable_input"),
    ],
)
def test_errors_use_openais_shape(
    url: str, body: dict[str, Any], status: int, param: str | None, code: str | None
) -> None:
    error = openai_error(httpx.post(f"{url}/v1/embeddings", json=body), status)
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert error["type"] == "invalid_request_error"


def test_the_token_limits_are_openais(url: str) -> None:
    over = "a " * MAX_INPUT_TOKENS  # 8192 words, 8194 tokens with [CLS] and [SEP]
    error = openai_error(
        httpx.post(f"{url}/v1/embeddings", json={"model": "st", "input": ["fine", over]}), 400
    )
    assert error["code"] == "context_length_exceeded" and "input[1]" in error["message"]
    at_limit = "a " * (MAX_INPUT_TOKENS - 2)  # exactly 8192 tokens: truncated, served
    served = httpx.post(f"{url}/v1/embeddings", json={"model": "st", "input": at_limit})
    assert served.status_code == 200 and served.json()["usage"]["prompt_tokens"] == ST_MAX_SEQ
    many = [at_limit] * (MAX_REQUEST_TOKENS // MAX_INPUT_TOKENS + 1)
    error = openai_error(
        httpx.post(f"{url}/v1/embeddings", json={"model": "st", "input": many}, timeout=60), 400
    )
    assert error["code"] == "max_tokens_per_request"


def test_other_failures_on_these_routes_are_openai_shaped_too(url: str) -> None:
    not_json = httpx.post(
        f"{url}/v1/embeddings", content=b"{oops", headers={"content-type": "application/json"}
    )
    assert openai_error(not_json, 400)["code"] == "invalid_json"
    huge = httpx.post(f"{url}/v1/embeddings", json={"model": "st", "input": "a " * 600_000})
    assert openai_error(huge, 413)["code"] == "request_too_large"
    wrong_method = httpx.get(f"{url}/v1/embeddings")
    assert openai_error(wrong_method, 405)["code"] == "method_not_allowed"
    # The other routes keep their own shape.
    other = httpx.post(f"{url}/models/nope", json={"inputs": ["x"]})
    assert other.status_code == 404 and isinstance(other.json()["error"], str)


# --- overload and deadlines: the SDK's retries follow the server's headers ------------------


def _wait_for_queue_depth(url: str, model: str, depth: float) -> None:
    for _ in range(2000):
        metrics = httpx.get(f"{url}/metrics").text
        if sample(metrics, "batching_queue_depth_items", -1.0, model=model) == depth:
            return
        time.sleep(0.005)
    raise AssertionError(f"the queue of {model} never reached {depth} items")


def test_the_sdk_retries_a_503_after_the_retry_after_ms_it_was_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wait_s = 0.1
    monkeypatch.setattr(batching.core.admission, "retry_after", lambda depth, capacity: wait_s)
    monkeypatch.setattr(batching.core.admission, "spread", lambda seconds, rng: seconds)
    model = GatedVectors()
    config = ModelConfig(name="gated", batching=BatchingConfig(max_queue_size=2))
    embeddings = {"model": "gated", "input": ["ab", "c"]}
    with (
        serving_in_thread(app_with(model, config)) as url,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        try:
            holder = pool.submit(httpx.post, f"{url}/v1/embeddings", json=embeddings, timeout=30)
            assert model.entered.wait(10)
            queued = pool.submit(httpx.post, f"{url}/v1/embeddings", json=embeddings, timeout=30)
            _wait_for_queue_depth(url, "gated", 2)

            refused = httpx.post(f"{url}/v1/embeddings", json=embeddings)
            assert openai_error(refused, 503)["code"] == "overloaded"
            assert refused.headers["retry-after-ms"] == "100"
            assert refused.headers["retry-after"] == "1"
            assert refused.headers["x-should-retry"] == "true"

            before = requests_counted(url, "gated", 503)
            with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=2) as sdk:
                started = time.monotonic()
                with pytest.raises(openai.InternalServerError) as failed:
                    sdk.embeddings.create(model="gated", input="one too many")
                waited = time.monotonic() - started
            assert failed.value.status_code == 503
            assert failed.value.type == "server_error"
            assert requests_counted(url, "gated", 503) - before == 3  # the first and 2 retries
            # It waited what the server said, not its own backoff (0.375 s, then 0.75 s, at
            # the least).
            assert 2 * wait_s <= waited < 1.0
        finally:
            model.gate.set()
        assert holder.result().status_code == 200
        assert queued.result().status_code == 200


def test_a_504_says_do_not_retry_and_the_sdk_does_not() -> None:
    model = GatedVectors()
    with (
        serving_in_thread(app_with(model, ModelConfig(name="gated"))) as url,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        try:
            holder = pool.submit(
                httpx.post, f"{url}/v1/embeddings", json={"model": "gated", "input": "x"}
            )
            assert model.entered.wait(10)
            with (
                openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=2) as sdk,
                pytest.raises(openai.InternalServerError) as late,
            ):
                sdk.embeddings.create(
                    model="gated", input="late", extra_headers={"x-request-timeout-ms": "100"}
                )
            assert late.value.status_code == 504
            assert late.value.response.headers["x-should-retry"] == "false"
            assert late.value.code == "timeout" and late.value.type == "server_error"
            assert requests_counted(url, "gated", 504) == 1  # no retry
        finally:
            model.gate.set()
        assert holder.result().status_code == 200
