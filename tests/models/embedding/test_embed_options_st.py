"""The embedding options end to end on a tiny sentence-transformers folder with prompts, on
every door with its own client (httpx for plain JSON, the ``openai`` SDK, tritonclient.http,
tritonclient.grpc): the vectors equal ``SentenceTransformer(folder).encode(text,
prompt_name=...)``, and the compact encodings equal ``quantize_embeddings`` with the ranges
the model's metadata shows."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from sentence_transformers import SentenceTransformer
from sentence_transformers.util.quantization import quantize_embeddings

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread
from tests.support.tiny import ST_MAX_SEQ, sentence_folder

PROMPTS = {"query": "what is ", "passage": "the a "}
TEXTS = ["the cat sat on the mat", "a dog"]
LONG = " ".join(["red blue green house tree"] * 20)  # far over ST_MAX_SEQ tokens
MODEL = "st"

Door = Callable[[list[str], dict[str, Any]], tuple[list[Any], Any]]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prompted")
    return sentence_folder(root, "st", prompts=PROMPTS, default_prompt_name="query")


@pytest.fixture(scope="module")
def reference(folder: Path) -> SentenceTransformer:
    return SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[tuple[str, str]]:
    grpc_port = free_port()
    config = ModelConfig(
        name=MODEL,
        source=str(folder),
        engine="torch",
        precision="fp32",
        batching=BatchingConfig(max_batch_size=4),
    )
    with serving_in_thread(create_app([config], grpc_port=grpc_port), timeout=120) as url:
        yield url, f"127.0.0.1:{grpc_port}"


def _indices(flags: list[bool]) -> str:
    """Which texts were cut, as the v2 doors say it: comma-separated indices."""
    return ",".join(str(index) for index, cut in enumerate(flags) if cut)


def _plain(url: str) -> Door:
    def call(texts: list[str], options: dict[str, Any]) -> tuple[list[Any], Any]:
        answer = httpx.post(f"{url}/models/{MODEL}", json={"inputs": texts, **options})
        assert answer.status_code == 200, answer.text
        return answer.json()["outputs"], _indices(answer.json()["truncated"])

    return call


def _openai(url: str) -> Door:
    def call(texts: list[str], options: dict[str, Any]) -> tuple[list[Any], Any]:
        extra = dict(options)
        encoding = extra.pop("encoding", "float")
        with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as sdk:
            response = sdk.embeddings.create(
                model=MODEL,
                input=texts,
                encoding_format=encoding,
                extra_body=extra,
            )
        flags = [(item.model_extra or {})["truncated"] for item in response.data]
        return [item.embedding for item in response.data], _indices(flags)

    return call


def _v2_http(url: str) -> Door:
    def call(texts: list[str], options: dict[str, Any]) -> tuple[list[Any], Any]:
        with triton_http.InferenceServerClient(url.removeprefix("http://")) as client:
            tensor = triton_http.InferInput("text", [len(texts), 1], "BYTES")
            tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1))
            result = client.infer(MODEL, [tensor], parameters=options)
        parameters = result.get_response()["parameters"]
        return list(result.as_numpy("embedding")), parameters["truncated_inputs"]

    return call


def _v2_grpc(target: str) -> Door:
    def call(texts: list[str], options: dict[str, Any]) -> tuple[list[Any], Any]:
        with triton_grpc.InferenceServerClient(target) as client:
            tensor = triton_grpc.InferInput("text", [len(texts), 1], "BYTES")
            tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1))
            result = client.infer(MODEL, [tensor], parameters=options)
        parameters = result.get_response().parameters
        return list(result.as_numpy("embedding")), parameters["truncated_inputs"].string_param

    return call


@pytest.fixture(scope="module")
def doors(server: tuple[str, str]) -> dict[str, Door]:
    url, target = server
    return {
        "plain": _plain(url),
        "openai": _openai(url),
        "v2 http": _v2_http(url),
        "v2 grpc": _v2_grpc(target),
    }


def _ranges(url: str) -> np.ndarray:
    info = httpx.get(f"{url}/v2/models/{MODEL}").json()["embedding"]
    return np.array(info["quantization_ranges"], dtype=np.float32)


@pytest.mark.parametrize("door", ["plain", "openai", "v2 http", "v2 grpc"])
@pytest.mark.parametrize("name", ["query", "passage", None])
def test_every_door_equals_encode_with_the_prompt_name(
    doors: dict[str, Door], reference: SentenceTransformer, door: str, name: str | None
) -> None:
    options = {} if name is None else {"prompt_name": name}
    vectors, _ = doors[door](TEXTS, options)
    # No prompt_name: the folder's default_prompt_name applies, as encode applies it.
    expected = reference.encode(TEXTS, prompt_name=name)
    np.testing.assert_allclose(np.array(vectors, dtype=np.float32), expected, atol=1e-5)


@pytest.mark.parametrize("door", ["plain", "openai", "v2 http", "v2 grpc"])
@pytest.mark.parametrize("encoding", ["int8", "uint8", "binary", "ubinary"])
def test_every_door_equals_quantize_embeddings_with_the_shown_ranges(
    server: tuple[str, str], doors: dict[str, Door], door: str, encoding: str
) -> None:
    ranges = _ranges(server[0])
    floats, _ = doors[door](TEXTS, {"prompt_name": "passage"})
    compact, _ = doors[door](TEXTS, {"prompt_name": "passage", "encoding": encoding})
    expected = quantize_embeddings(np.array(floats, dtype=np.float32), encoding, ranges=ranges)
    assert np.array(compact).tolist() == expected.tolist()


def test_dimensions_composes_with_an_encoding_and_base64_carries_its_bytes(
    server: tuple[str, str], reference: SentenceTransformer
) -> None:
    url = server[0]
    short = reference.encode(TEXTS, prompt_name="query", truncate_dim=16, normalize_embeddings=True)

    def ask(encoding: str) -> list[Any]:
        answer = httpx.post(
            f"{url}/v1/embeddings",
            json={"model": MODEL, "input": TEXTS, "dimensions": 16, "encoding_format": encoding},
        )
        assert answer.status_code == 200, answer.text
        return [item["embedding"] for item in answer.json()["data"]]

    np.testing.assert_allclose(np.array(ask("float")), short, atol=1e-5)
    packed = [base64.b64decode(text) for text in ask("ubinary+base64")]
    assert packed == [row.tobytes() for row in quantize_embeddings(short, "ubinary")]
    assert ask("binary") == quantize_embeddings(short, "binary").tolist()


@pytest.mark.parametrize("door", ["plain", "openai", "v2 http", "v2 grpc"])
def test_long_texts_are_cut_and_said_so_or_refused_on_request(
    server: tuple[str, str], doors: dict[str, Door], reference: SentenceTransformer, door: str
) -> None:
    vectors, truncated = doors[door]([TEXTS[0], LONG], {"truncation_direction": "right"})
    assert truncated == "1"
    np.testing.assert_allclose(vectors[1], reference.encode(LONG), atol=1e-5)
    answer = httpx.post(f"{server[0]}/models/{MODEL}", json={"inputs": [LONG], "truncate": False})
    assert answer.status_code == 413
    assert f"limit of {ST_MAX_SEQ} tokens" in answer.json()["error"]
