"""The image tasks served from tiny folders built from a config, on every door: an
image-classification answer equals ``transformers.pipeline("image-classification")`` and an
image-text-embedding vector equals ``CLIPModel.get_image_features`` / ``get_text_features``
within 1e-4 (``precision="fp32"``); 16 concurrent requests equal their single answers and
``/metrics`` shows batches over 1; bad input is a 4xx with a JSON body (an INVALID_ARGUMENT
over gRPC); and each task warms up with a generated image, or never reports ready."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import orjson
import pytest
import torch
import transformers
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from PIL import Image
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from batching.models.images.classifier import ImageClassifier
from batching.models.images.clip import ImageTextEmbedder
from batching.models.parameters import TaskItem
from batching.runtime.warmup import load_and_warm
from tests.support.metrics import sample
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread
from tests.support.vision import classifier_folder, clip_folder, png

IMAGES = [png(40, 30, seed) for seed in range(3)]
TEXTS = ["a photo of the cat", "red car", "the blue bird"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vision")
    return classifier_folder(root), clip_folder(root)


@pytest.fixture(scope="module")
def server(folders: tuple[Path, Path]) -> Iterator[tuple[str, str]]:
    vit, clip = folders
    batching = BatchingConfig(max_batch_size=16, max_queue_delay=0.02)
    configs = [
        ModelConfig(
            name="vit",
            source=str(vit),
            task="image-classification",
            precision="fp32",
            batching=batching,
        ),
        ModelConfig(
            name="clip",
            source=str(clip),
            task="image-text-embedding",
            precision="fp32",
            batching=batching,
        ),
    ]
    grpc_port = free_port()
    with serving_in_thread(create_app(configs, grpc_port=grpc_port), timeout=120) as url:
        yield url, f"127.0.0.1:{grpc_port}"


def _pil(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _same_labels(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [row["label"] for row in got] == [row["label"] for row in want]
    np.testing.assert_allclose(
        [row["score"] for row in got], [row["score"] for row in want], atol=1e-4
    )


def _v2_http(url: str, model: str, name: str, data: list[Any], **kwargs: Any) -> Any:
    with triton_http.InferenceServerClient(url.removeprefix("http://")) as client:
        tensor = triton_http.InferInput(name, [len(data)], "BYTES")
        tensor.set_data_from_numpy(np.array(data, dtype=object), binary_data=True)
        return client.infer(model, [tensor], **kwargs)


def _v2_grpc(target: str, model: str, name: str, data: list[Any], **kwargs: Any) -> Any:
    with triton_grpc.InferenceServerClient(target) as client:
        tensor = triton_grpc.InferInput(name, [len(data)], "BYTES")
        tensor.set_data_from_numpy(np.array(data, dtype=object))
        return client.infer(model, [tensor], **kwargs)


def _json_rows(result: Any, name: str = "output") -> list[Any]:
    return [orjson.loads(row) for row in result.as_numpy(name).reshape(-1)]


def test_image_classification_equals_the_pipeline_on_every_door(
    server: tuple[str, str], folders: tuple[Path, Path]
) -> None:
    url, target = server
    pipe = transformers.pipeline("image-classification", model=str(folders[0]))
    want = [pipe(_pil(data)) for data in IMAGES]
    raw = httpx.post(
        f"{url}/models/vit", content=IMAGES[0], headers={"Content-Type": "image/png"}, timeout=30
    )
    assert raw.status_code == 200, raw.text
    _same_labels(raw.json()["outputs"][0], want[0])
    as_json = httpx.post(
        f"{url}/models/vit", json={"inputs": [_b64(data) for data in IMAGES]}, timeout=30
    )
    for got, expected in zip(as_json.json()["outputs"], want, strict=True):
        _same_labels(got, expected)
    for rows in (
        _json_rows(_v2_http(url, "vit", "image", IMAGES)),
        _json_rows(_v2_grpc(target, "vit", "image", IMAGES)),
    ):
        for got, expected in zip(rows, want, strict=True):
            _same_labels(got, expected)


def test_top_k_is_a_parameter_on_every_door(
    server: tuple[str, str], folders: tuple[Path, Path]
) -> None:
    url, target = server
    pipe = transformers.pipeline("image-classification", model=str(folders[0]))
    want = pipe(_pil(IMAGES[1]), top_k=2)
    plain = httpx.post(
        f"{url}/models/vit",
        json={"inputs": [_b64(IMAGES[1])], "parameters": {"top_k": 2}},
        timeout=30,
    )
    assert plain.status_code == 200, plain.text
    _same_labels(plain.json()["outputs"][0], want)
    _same_labels(
        _json_rows(_v2_http(url, "vit", "image", IMAGES[1:2], parameters={"top_k": 2}))[0], want
    )
    _same_labels(
        _json_rows(_v2_grpc(target, "vit", "image", IMAGES[1:2], parameters={"top_k": 2}))[0], want
    )
    sigmoid = pipe(_pil(IMAGES[2]), top_k=3, function_to_apply="sigmoid")
    as_sigmoid = httpx.post(
        f"{url}/models/vit",
        json={
            "inputs": [_b64(IMAGES[2]), _b64(IMAGES[2])],
            "parameters": {"top_k": 3, "function_to_apply": "sigmoid"},
        },
        timeout=30,
    )
    for got in as_sigmoid.json()["outputs"]:
        _same_labels(got, sigmoid)
    for parameters in (
        {"top_k": 0},
        {"top_k": "two"},
        {"stride": 1},
        {"function_to_apply": "tanh"},
    ):
        refused = httpx.post(
            f"{url}/models/vit",
            json={"inputs": [_b64(IMAGES[1])], "parameters": parameters},
            timeout=30,
        )
        assert refused.status_code == 400 and next(iter(parameters)) in refused.json()["error"]
        with pytest.raises(InferenceServerException) as caught:
            _v2_grpc(target, "vit", "image", IMAGES[1:2], parameters=parameters)
        assert str(caught.value.status()) == "StatusCode.INVALID_ARGUMENT"


def _clip_reference(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    model = transformers.CLIPModel.from_pretrained(str(folder)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    processor = transformers.CLIPImageProcessor.from_pretrained(str(folder))
    with torch.inference_mode():
        encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")
        texts = model.get_text_features(
            input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]
        )
        pixels = processor(images=[_pil(data) for data in IMAGES], return_tensors="pt")
        images = model.get_image_features(**pixels)
    as_array = [t if isinstance(t, torch.Tensor) else t.pooler_output for t in (texts, images)]
    return as_array[0].numpy(), as_array[1].numpy()


def test_image_text_embeddings_equal_the_model_on_every_door(
    server: tuple[str, str], folders: tuple[Path, Path]
) -> None:
    url, target = server
    texts, images = _clip_reference(folders[1])
    close = {"atol": 1e-4, "rtol": 0}
    raw = httpx.post(
        f"{url}/models/clip", content=IMAGES[0], headers={"Content-Type": "image/png"}, timeout=30
    )
    assert raw.status_code == 200, raw.text
    np.testing.assert_allclose(raw.json()["outputs"], images[:1], **close)
    mixed = httpx.post(
        f"{url}/models/clip",
        json={"inputs": [TEXTS[0], {"image": _b64(IMAGES[1])}, {"text": TEXTS[2]}]},
        timeout=30,
    )
    assert mixed.status_code == 200, mixed.text
    np.testing.assert_allclose(mixed.json()["outputs"], [texts[0], images[1], texts[2]], **close)
    for infer in (_v2_http, _v2_grpc):
        where = url if infer is _v2_http else target
        got_images = infer(where, "clip", "image", IMAGES).as_numpy("embedding")
        got_texts = infer(where, "clip", "text", TEXTS).as_numpy("embedding")
        np.testing.assert_allclose(got_images, images, **close)
        np.testing.assert_allclose(got_texts, texts, **close)
    sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    answer = sdk.embeddings.create(model="clip", input=TEXTS, encoding_format="float")
    np.testing.assert_allclose([row.embedding for row in answer.data], texts, **close)


def test_an_item_is_a_text_or_an_image_not_both(server: tuple[str, str]) -> None:
    url, target = server
    both = httpx.post(
        f"{url}/models/clip",
        json={"inputs": [{"text": "a cat", "image": _b64(IMAGES[0])}]},
        timeout=30,
    )
    assert both.status_code == 400 and "exactly one of" in both.json()["error"]
    with triton_grpc.InferenceServerClient(target) as client:
        text = triton_grpc.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array(["a cat"], dtype=object))
        image = triton_grpc.InferInput("image", [1], "BYTES")
        image.set_data_from_numpy(np.array([IMAGES[0]], dtype=object))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("clip", [text, image])
    assert str(caught.value.status()) == "StatusCode.INVALID_ARGUMENT"


def _over_one(url: str, model: str) -> float:
    """Batches of more than one item ``model`` has run, from ``/metrics``."""
    metrics = httpx.get(f"{url}/metrics").text
    return sample(metrics, "batching_batch_size_items_count", model=model) - sample(
        metrics, "batching_batch_size_items_bucket", model=model, le="1.0"
    )


@pytest.mark.parametrize("model", ["vit", "clip"])
def test_sixteen_concurrent_requests_equal_their_single_answers_in_batches(
    server: tuple[str, str], model: str
) -> None:
    url, _ = server
    images = [png(36 + seed, 28, 100 + seed) for seed in range(16)]
    # The embedder gets texts and images mixed: each batch runs its texts and its images.
    bodies: list[dict[str, Any]] = [
        {"content": data, "headers": {"Content-Type": "image/png"}}
        if model == "vit" or seed % 2
        else {"json": {"inputs": [f"{TEXTS[seed % 3]} {seed}"]}}
        for seed, data in enumerate(images)
    ]

    def ask(body: dict[str, Any]) -> Any:
        answer = httpx.post(f"{url}/models/{model}", timeout=60, **body)
        assert answer.status_code == 200, answer.text
        return answer.json()["outputs"][0]

    single = [ask(body) for body in bodies]
    before = _over_one(url, model)
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, bodies))
    for got, want in zip(together, single, strict=True):
        if model == "vit":
            _same_labels(got, want)
        else:
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert _over_one(url, model) > before


def test_bad_images_are_a_400_with_a_json_body_on_every_door(server: tuple[str, str]) -> None:
    url, target = server
    junk = b"GIF89a but not really"
    for model in ("vit", "clip"):
        raw = httpx.post(
            f"{url}/models/{model}", content=junk, headers={"Content-Type": "image/gif"}
        )
        assert raw.status_code == 400 and "decode" in raw.json()["error"]
        name = "image"
        with pytest.raises(InferenceServerException) as http_caught:
            _v2_http(url, model, name, [junk])
        assert http_caught.value.status() == "400"
        with pytest.raises(InferenceServerException) as grpc_caught:
            _v2_grpc(target, model, name, [junk])
        assert str(grpc_caught.value.status()) == "StatusCode.INVALID_ARGUMENT"
    not_base64 = httpx.post(f"{url}/models/vit", json={"inputs": ["/etc/hostname"]})
    assert not_base64.status_code == 400 and "base64" in not_base64.json()["error"]


def test_each_task_warms_up_with_a_generated_image(folders: tuple[Path, Path]) -> None:
    vit, clip = folders
    classifier = load_and_warm(ImageClassifier("image-classification", vit), "cpu", 4)
    assert classifier.warmup_batches == 2
    embedder = load_and_warm(ImageTextEmbedder("image-text-embedding", clip), "cpu", 4)
    assert embedder.warmup_batches == 3


def test_a_model_that_cannot_serve_images_never_reports_ready(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    broken = classifier_folder(tmp_path, "broken")
    # An image processor that makes 48x48 inputs for a model of 32x32 ones: it loads, and
    # fails its first forward pass, which the warm-up runs.
    transformers.ViTImageProcessor(size={"height": 48, "width": 48}).save_pretrained(broken)
    with pytest.raises(RuntimeError, match="warm-up batch 1"):
        load_and_warm(ImageClassifier("image-classification", broken), "cpu", 4)


def test_items_with_different_parameters_share_one_forward_pass(
    folders: tuple[Path, Path],
) -> None:
    vit = folders[0]
    pipe = transformers.pipeline("image-classification", model=str(vit))
    model = ImageClassifier("image-classification", vit)
    model.load("cpu")
    calls: list[int] = []
    forward = model._pipeline.model.forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return forward(*args, **kwargs)

    model._pipeline.model.forward = counted
    items = [
        TaskItem(IMAGES[0], (("top_k", 1),)),
        TaskItem(IMAGES[0], (("function_to_apply", "none"), ("top_k", 3))),
        IMAGES[1],
    ]
    got = model.predict(items)
    assert len(calls) == 1
    _same_labels(got[0], pipe(_pil(IMAGES[0]), top_k=1))
    _same_labels(got[1], pipe(_pil(IMAGES[0]), top_k=3, function_to_apply="none"))
    _same_labels(got[2], pipe(_pil(IMAGES[1])))
