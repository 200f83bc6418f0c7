"""The decode budget on every door, against a real server on 127.0.0.1 serving tiny ViT and
CLIP folders: the 25,000,000 x 1 greyscale PNG of the report is served by the classifier
(reduced to a few hundred pixels before its processor sees it) and refused by CLIP (its
processor would stretch it to 224 rows of billions of pixels); an image whose decoding alone
exceeds the budget is a 413 read from its header; a tighter ``max_decode_bytes`` refuses what
the default serves; and a large photo is answered as the pipeline answers it at full size.
Each refusal is a 413 with a JSON body naming ``--max-decode-bytes`` on the plain door and
KServe v2 HTTP, and ``INVALID_ARGUMENT`` with the same message over gRPC."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import transformers
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from PIL import Image
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread
from tests.support.vision import classifier_folder, clip_folder

#: The budget of the ``vit-tight`` model: 4 MiB.
TIGHT = 4 << 20


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


#: The report's image: 25,000,000 x 1 greyscale, 24 KB as a PNG.
STRIP = _png(Image.new("L", (25_000_000, 1), 128))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("decode-budget")
    # The classifier takes 224 x 224, as ViT-Base does; CLIP its tiny 32.
    return classifier_folder(root, size=224), clip_folder(root)


@pytest.fixture(scope="module")
def server(folders: tuple[Path, Path]) -> Iterator[tuple[str, str]]:
    vit, clip = folders
    batching = BatchingConfig(max_batch_size=4)
    configs = [
        ModelConfig(name="vit", source=str(vit), task="image-classification", batching=batching),
        ModelConfig(
            name="vit-tight",
            source=str(vit),
            task="image-classification",
            batching=batching,
            max_decode_bytes=TIGHT,
        ),
        ModelConfig(name="clip", source=str(clip), task="image-text-embedding", batching=batching),
    ]
    grpc_port = free_port()
    with serving_in_thread(create_app(configs, grpc_port=grpc_port), timeout=120) as url:
        yield url, f"127.0.0.1:{grpc_port}"


def _plain(url: str, model: str, data: bytes) -> httpx.Response:
    return httpx.post(
        f"{url}/models/{model}", content=data, headers={"Content-Type": "image/png"}, timeout=60
    )


def _v2_json(url: str, model: str, data: bytes) -> httpx.Response:
    tensor = {"name": "image", "datatype": "BYTES", "shape": [1]}
    tensor["data"] = [base64.b64encode(data).decode()]
    return httpx.post(f"{url}/v2/models/{model}/infer", json={"inputs": [tensor]}, timeout=60)


def _infer(client: Any, module: Any, model: str, data: bytes) -> Any:
    tensor = module.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([data], dtype=object))
    return client.infer(model, [tensor])


def _v2_binary(url: str, model: str, data: bytes) -> Any:
    with triton_http.InferenceServerClient(url.removeprefix("http://")) as client:
        return _infer(client, triton_http, model, data)


def _grpc(target: str, model: str, data: bytes) -> Any:
    with triton_grpc.InferenceServerClient(target) as client:
        return _infer(client, triton_grpc, model, data)


def _refused_everywhere(server: tuple[str, str], model: str, data: bytes) -> list[str]:
    """``data`` sent to ``model`` on every door, each refused as too large: the messages."""
    url, target = server
    messages = []
    for response in (_plain(url, model, data), _v2_json(url, model, data)):
        assert response.status_code == 413, response.text
        messages.append(response.json()["error"])
    with pytest.raises(InferenceServerException) as binary:
        _v2_binary(url, model, data)
    assert binary.value.status() == "413"
    with pytest.raises(InferenceServerException) as over_grpc:
        _grpc(target, model, data)
    assert str(over_grpc.value.status()) == "StatusCode.INVALID_ARGUMENT"
    messages += [binary.value.message(), over_grpc.value.message()]
    assert all("--max-decode-bytes" in message for message in messages), messages
    return messages


def _labels(result: Any) -> list[Any]:
    return [orjson.loads(row) for row in result.as_numpy("output").reshape(-1)]


def test_the_reported_strip_is_served_by_a_model_that_squeezes_it(
    server: tuple[str, str],
) -> None:
    url, target = server
    raw = _plain(url, "vit", STRIP)
    assert raw.status_code == 200, raw.text
    answer = raw.json()["outputs"][0]
    assert len(answer) == 5 and all(set(row) == {"label", "score"} for row in answer)
    as_json = _v2_json(url, "vit", STRIP).json()["outputs"][0]["data"]
    assert [orjson.loads(row) for row in as_json] == [answer]
    assert _labels(_v2_binary(url, "vit", STRIP)) == [answer]
    assert _labels(_grpc(target, "vit", STRIP)) == [answer]


def test_a_strip_the_processor_would_stretch_is_a_413_on_every_door(
    server: tuple[str, str],
) -> None:
    messages = _refused_everywhere(server, "clip", STRIP)
    # CLIP's processor keeps the aspect ratio: 224 rows of 5.6 billion pixels.
    assert "25000000x1 PNG image (L)" in messages[0]


def test_an_image_whose_decoding_exceeds_the_budget_is_a_413_from_its_header(
    server: tuple[str, str],
) -> None:
    rgb = _png(Image.new("RGB", (25_000_000, 1), (10, 20, 30)))
    messages = _refused_everywhere(server, "vit", rgb)
    assert "would take about 25" in messages[0]  # 100 MB of pixels, two rows of 75 MB
    # Its header alone gets the same answer: nothing was decoded to give it.
    assert _refused_everywhere(server, "vit", rgb[:120])[0] == messages[0]


def test_a_tighter_budget_refuses_what_the_default_serves(server: tuple[str, str]) -> None:
    url, _ = server
    square = _png(Image.new("RGB", (1500, 1500), (200, 30, 30)))  # 9 MB of pixels decoded
    assert _plain(url, "vit", square).status_code == 200
    messages = _refused_everywhere(server, "vit-tight", square)
    assert f"at most {TIGHT // 1_000_000} MB" in messages[0]


def test_a_large_photo_is_answered_as_the_pipeline_answers_it_at_full_size(
    server: tuple[str, str], folders: tuple[Path, Path]
) -> None:
    url, target = server
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:2000, 0:2800].astype(np.float32)  # 766 KB as a JPEG
    waves = np.stack([127 + 100 * np.sin(x / 380), 127 + 100 * np.cos(y / 400), 100 + 0 * x], -1)
    pixels = np.clip(waves + rng.normal(0, 6, waves.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=85)
    photo = buffer.getvalue()
    pipe = transformers.pipeline("image-classification", model=str(folders[0]))
    want = {row["label"]: row["score"] for row in pipe(_full(photo), top_k=6)}
    body = {"inputs": [base64.b64encode(photo).decode()], "parameters": {"top_k": 6}}
    plain = httpx.post(f"{url}/models/vit", json=body, timeout=60)
    assert plain.status_code == 200, plain.text
    with triton_grpc.InferenceServerClient(target) as client:
        tensor = triton_grpc.InferInput("image", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([photo], dtype=object))
        over_grpc = _labels(client.infer("vit", [tensor], parameters={"top_k": 6}))[0]
    for answer in (plain.json()["outputs"][0], over_grpc):
        got = {row["label"]: row["score"] for row in answer}
        assert answer[0]["label"] == max(want, key=want.__getitem__)
        # Decoded at half its size (1400 x 1000) and reduced to 700 x 1000, at least 3 x the
        # model's 224 x 224, first: the processor's input is within a level of 255 of the
        # full-size one (tests/models/shared/test_image_budget.py).
        np.testing.assert_allclose([got[label] for label in want], list(want.values()), atol=0.01)


def _full(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")
