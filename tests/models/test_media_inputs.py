"""Media bytes on every door: a model whose metadata says ``"content": "image"`` gets
``bytes`` from a raw ``image/*`` body, base64 JSON (plain and KServe v2), v2 binary tensors and
gRPC raw tensors; a string is only ever base64, never a path to open or a URL to fetch; an
undecodable image is a 400 and one over ``max_image_pixels`` a 413 read from its header, on the
plain, v2 HTTP and gRPC doors alike."""

from __future__ import annotations

import base64
import hashlib
import io
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from PIL import Image
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelBase, ModelConfig, create_app
from batching.models.shared.imaging import sample_png
from tests.support.grpc_door import raw_output, typed_request
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread
from tests.support.url_trap import Trap, url_trap

MODEL = "bytes"
#: Low enough that a small generated image is over it.
MAX_PIXELS = 100 * 100


class ImageDigest(ModelBase):
    """Answers each image's SHA-256: proof of exactly which bytes the model got."""

    def predict(self, inputs: list[Any]) -> list[str]:
        for item in inputs:
            if type(item) is not bytes:
                raise TypeError(f"the model got {type(item).__name__}, not bytes")
        return [hashlib.sha256(item).hexdigest() for item in inputs]

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "image", "datatype": "BYTES", "shape": [-1], "content": "image"}],
            "outputs": [{"name": "digest", "datatype": "BYTES", "shape": [-1]}],
        }


PNG = sample_png(32, 24)
DIGEST = hashlib.sha256(PNG).hexdigest()


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def trap() -> Iterator[Trap]:
    with url_trap(PNG, "image/png", "cat.png") as serving:
        yield serving


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, str]]:
    grpc_port = free_port()
    config = ModelConfig(
        name=MODEL, batching=BatchingConfig(max_batch_size=8), max_image_pixels=MAX_PIXELS
    )
    app = create_app(config, builder=lambda _: ImageDigest(), grpc_port=grpc_port)
    with serving_in_thread(app) as url:
        yield url, f"127.0.0.1:{grpc_port}"


def _plain(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{url}/models/{MODEL}", timeout=30, **kwargs)


def _v2_http(url: str, value: Any, binary: bool) -> Any:
    with triton_http.InferenceServerClient(url.removeprefix("http://")) as client:
        tensor = triton_http.InferInput("image", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([value], dtype=object), binary_data=binary)
        return client.infer(MODEL, [tensor]).as_numpy("digest").reshape(-1)[0]


def _v2_grpc(target: str, value: bytes) -> Any:
    with triton_grpc.InferenceServerClient(target) as client:
        tensor = triton_grpc.InferInput("image", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([value], dtype=object))
        return client.infer(MODEL, [tensor]).as_numpy("digest").reshape(-1)[0]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def test_every_door_hands_the_model_the_image_bytes(server: tuple[str, str]) -> None:
    url, target = server
    encoded = base64.b64encode(PNG).decode()
    raw = _plain(url, content=PNG, headers={"Content-Type": "image/png"})
    assert raw.status_code == 200, raw.text
    assert raw.json()["outputs"] == [DIGEST]
    octets = _plain(url, content=PNG, headers={"Content-Type": "application/octet-stream"})
    assert octets.json()["outputs"] == [DIGEST]
    as_json = _plain(
        url,
        json={"inputs": [encoded, f"data:image/png;base64,{encoded}", {"image": encoded}]},
    )
    assert as_json.status_code == 200, as_json.text
    assert as_json.json()["outputs"] == [DIGEST, DIGEST, DIGEST]
    assert _text(_v2_http(url, encoded, binary=False)) == DIGEST
    assert _text(_v2_http(url, PNG, binary=True)) == DIGEST
    assert _text(_v2_grpc(target, PNG)) == DIGEST


def _refusals(url: str, target: str, value: str) -> list[tuple[str, int, str]]:
    """``value`` sent as the image on every door that carries text: (door, status, message)."""
    answers: list[tuple[str, int, str]] = []
    plain = _plain(url, json={"inputs": [value]})
    answers.append(("plain", plain.status_code, plain.json()["error"]))
    v2 = httpx.post(
        f"{url}/v2/models/{MODEL}/infer",
        json={"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": [value]}]},
        timeout=30,
    )
    answers.append(("v2 http json", v2.status_code, v2.json()["error"]))
    for door, call in (
        ("v2 http binary", lambda: _v2_http(url, value.encode(), binary=True)),
        ("v2 grpc", lambda: _v2_grpc(target, value.encode())),
    ):
        with pytest.raises(InferenceServerException) as refused:
            call()
        status = refused.value.status()
        code = {"StatusCode.INVALID_ARGUMENT": 400, "StatusCode.RESOURCE_EXHAUSTED": 413}.get(
            str(status), int(status) if str(status).isdigit() else -1
        )
        answers.append((door, code, refused.value.message()))
    return answers


def test_a_url_is_never_fetched(server: tuple[str, str], trap: Trap) -> None:
    url, target = server
    trap.seen.clear()
    answers = _refusals(url, target, trap.url)
    assert [status for _, status, _ in answers] == [400] * 4, answers
    assert trap.seen == []
    assert all("127.0.0.1" not in message for _, _, message in answers)
    # The trap answers whoever asks: it would have been seen had the server fetched it.
    assert httpx.get(trap.url).content == PNG and trap.seen == ["/cat.png"]


def test_a_path_is_never_opened(server: tuple[str, str], tmp_path: Path) -> None:
    url, target = server
    path = tmp_path / "cat.png"
    path.write_bytes(PNG)
    opened: list[Any] = []
    watching = threading.Event()

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if watching.is_set() and event == "open" and args and str(args[0]) == str(path):
            opened.append(args)

    sys.addaudithook(audit)  # a hook cannot be removed: it stops watching when the test ends
    watching.set()
    try:
        answers = _refusals(url, target, str(path))
        assert [status for _, status, _ in answers] == [400] * 4, answers
        assert opened == []
        assert all(str(tmp_path) not in message for _, _, message in answers)
        path.read_bytes()  # the hook sees a real open of that path
        assert opened
    finally:
        watching.clear()


def test_undecodable_bytes_are_a_400_on_every_door(server: tuple[str, str]) -> None:
    url, target = server
    junk = b"\x89PNG\r\n\x1a\n this is not an image"
    raw = _plain(url, content=junk, headers={"Content-Type": "image/png"})
    assert raw.status_code == 400 and "decode" in raw.json()["error"]
    truncated = PNG[: len(PNG) // 2]
    cut = _plain(url, content=truncated, headers={"Content-Type": "image/png"})
    assert cut.status_code == 400, cut.text
    answers = _refusals(url, target, base64.b64encode(junk).decode())
    # Base64 that decodes to junk: v2 binary and gRPC carry the text's bytes (not an image).
    assert [status for _, status, _ in answers] == [400] * 4, answers


def test_an_image_over_the_pixel_limit_is_a_413_read_from_its_header(
    server: tuple[str, str],
) -> None:
    url, target = server
    big = _png(200, 100)  # 20000 pixels, twice the limit
    raw = _plain(url, content=big, headers={"Content-Type": "image/png"})
    assert raw.status_code == 413 and "200x100" in raw.json()["error"]
    # Its header alone: with the pixels cut off it could never be decoded, yet the answer is
    # the 413, so the size was read before any decoding.
    header_only = big[:64]
    cut = _plain(url, content=header_only, headers={"Content-Type": "image/png"})
    assert cut.status_code == 413, cut.text
    encoded = base64.b64encode(header_only).decode()
    v2 = httpx.post(
        f"{url}/v2/models/{MODEL}/infer",
        json={"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": [encoded]}]},
        timeout=30,
    )
    assert v2.status_code == 413, v2.text
    with pytest.raises(InferenceServerException) as refused:
        _v2_grpc(target, header_only)
    # gRPC answers every PayloadTooLarge with INVALID_ARGUMENT (batching/grpc/errors.py).
    assert str(refused.value.status()) == "StatusCode.INVALID_ARGUMENT"
    assert "pixels" in refused.value.message()


def test_bad_media_input_is_a_400_with_a_json_body(server: tuple[str, str]) -> None:
    url, target = server
    for value in ("not base64!", "data:text/plain;base64,aGVsbG8=", ""):
        answers = _refusals(url, target, value)
        assert [status for _, status, _ in answers] == [400] * 4, (value, answers)
    wrong_type = _plain(url, json={"inputs": [42]})
    assert wrong_type.status_code == 400 and "base64" in wrong_type.json()["error"]
    audio = _plain(url, content=b"RIFF....WAVE", headers={"Content-Type": "audio/wav"})
    assert audio.status_code == 400 and "image/*" in audio.json()["error"]
    fp32 = httpx.post(
        f"{url}/v2/models/{MODEL}/infer",
        json={"inputs": [{"name": "image", "datatype": "FP32", "shape": [1], "data": [1.0]}]},
        timeout=30,
    )
    assert fp32.status_code == 400 and "BYTES" in fp32.json()["error"]


def test_grpc_typed_bytes_contents_carry_raw_image_bytes(server: tuple[str, str]) -> None:
    _, target = server
    request = typed_request(MODEL, "image", "BYTES", [2], "bytes_contents", [PNG, PNG])
    with grpc.insecure_channel(target) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert [_text(row) for row in raw_output(response).reshape(-1)] == [DIGEST, DIGEST]
