"""The audio tasks on every door, against a real server on 127.0.0.1 serving tiny Wav2Vec2
(CTC and classification) and Whisper models: a raw ``audio/wav`` or ``audio/flac`` body,
base64 in JSON, KServe v2 BYTES (JSON and binary) and gRPC, and float samples as a v2 FP32
tensor; 16 concurrent requests equal their single answers and run in batches over one; a
string is never a path or a URL; undecodable audio is a 400 and a too-long one a 413 read from
its header, on the plain, v2 HTTP and gRPC doors alike, each with a JSON error body on
HTTP."""

from __future__ import annotations

import asyncio
import base64
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import torch
import transformers
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from batching.models.audio.audio_model import AudioModel
from batching.models.shared.waveform import decode, from_samples
from tests.support.asgi import serving
from tests.support.audio import (
    RATE,
    audio_file,
    classifier_folder,
    ctc_folder,
    tone,
    wav2vec2_config,
    whisper_folder,
)
from tests.support.metrics import sample
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread
from tests.support.url_trap import Trap, url_trap

ASR = "automatic-speech-recognition"
CLASSIFY = "audio-classification"
WHISPER = "whisper"
#: The served models' names, and their tasks (Whisper: speech recognition too).
MODELS = {"asr": ASR, "kws": CLASSIFY, "whisper": WHISPER}
MAX_SECONDS = 2.0

WAV = audio_file(tone(0.8, 330.0))
FLAC = audio_file(tone(0.6, 610.0, 44_100, channels=2), 44_100, "FLAC")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("audio-doors")
    return {ASR: ctc_folder(root), CLASSIFY: classifier_folder(root), WHISPER: whisper_folder(root)}


@pytest.fixture(scope="module")
def server(folders: dict[str, Path]) -> Iterator[tuple[str, str]]:
    grpc_port = free_port()
    configs = [
        ModelConfig(
            name=name,
            source=str(folders[task]),
            task=ASR if task == WHISPER else task,
            batching=BatchingConfig(max_batch_size=16, max_queue_delay=0.05),
            max_audio_seconds=MAX_SECONDS,
        )
        for name, task in MODELS.items()
    ]
    app = create_app(configs, grpc_port=grpc_port)
    with serving_in_thread(app, timeout=120) as url:
        yield url, f"127.0.0.1:{grpc_port}"


@pytest.fixture(scope="module")
def pipelines(folders: dict[str, Path]) -> dict[str, Any]:
    return {
        name: transformers.pipeline(ASR if task == WHISPER else task, model=str(folders[task]))
        for name, task in MODELS.items()
    }


def _plain(url: str, model: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{url}/models/{model}", timeout=60, **kwargs)


def _v2_json(url: str, model: str, inputs: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/v2/models/{model}/infer", json={"inputs": inputs, **extra}, timeout=60
    )


def _audio_input(client: Any, value: bytes, binary: bool | None = None) -> Any:
    tensor = client.InferInput("audio", [1], "BYTES")
    kwargs = {} if binary is None else {"binary_data": binary}
    tensor.set_data_from_numpy(np.array([value], dtype=object), **kwargs)
    return tensor


def _samples_input(client: Any, row: np.ndarray, binary: bool | None = None) -> Any:
    tensor = client.InferInput("samples", [1, len(row)], "FP32")
    kwargs = {} if binary is None else {"binary_data": binary}
    tensor.set_data_from_numpy(row.reshape(1, -1).astype(np.float32), **kwargs)
    return tensor


def _answer(result: Any) -> Any:
    value = result.as_numpy("output").reshape(-1)[0]
    return orjson.loads(value)


def _v2_http(url: str, model: str, tensor_of: Callable[[Any], Any]) -> Any:
    with triton_http.InferenceServerClient(url.removeprefix("http://")) as client:
        return _answer(client.infer(model, [tensor_of(triton_http)]))


def _v2_grpc(target: str, model: str, tensor_of: Callable[[Any], Any]) -> Any:
    with triton_grpc.InferenceServerClient(target) as client:
        return _answer(client.infer(model, [tensor_of(triton_grpc)]))


def _close(ours: Any, theirs: Any) -> None:
    if isinstance(theirs, dict):
        assert ours == theirs
        return
    assert [entry["label"] for entry in ours] == [entry["label"] for entry in theirs]
    np.testing.assert_allclose(
        [entry["score"] for entry in ours], [entry["score"] for entry in theirs], atol=1e-4
    )


@pytest.mark.parametrize("model", ["asr", "kws", "whisper"])
def test_every_door_answers_as_the_pipeline_does(
    server: tuple[str, str], pipelines: dict[str, Any], model: str
) -> None:
    url, target = server
    expected = pipelines[model](decode(WAV, RATE, 30.0).samples)
    expected_flac = pipelines[model](decode(FLAC, RATE, 30.0).samples)
    encoded = base64.b64encode(WAV).decode()
    answers: dict[str, Any] = {}
    for content_type in ("audio/wav", "audio/x-wav", "application/octet-stream"):
        raw = _plain(url, model, content=WAV, headers={"Content-Type": content_type})
        assert raw.status_code == 200, raw.text
        answers[content_type] = raw.json()["outputs"][0]
    flac = _plain(url, model, content=FLAC, headers={"Content-Type": "audio/flac"})
    assert flac.status_code == 200, flac.text
    _close(flac.json()["outputs"][0], expected_flac)
    as_json = _plain(url, model, json={"inputs": [encoded, {"audio": encoded}]})
    assert as_json.status_code == 200, as_json.text
    answers["plain json"], answers["plain json named"] = as_json.json()["outputs"]
    v2 = _v2_json(
        url, model, [{"name": "audio", "datatype": "BYTES", "shape": [1], "data": [encoded]}]
    )
    assert v2.status_code == 200, v2.text
    answers["v2 json"] = orjson.loads(v2.json()["outputs"][0]["data"][0])
    answers["v2 binary"] = _v2_http(url, model, lambda c: _audio_input(c, WAV, binary=True))
    answers["grpc"] = _v2_grpc(target, model, lambda c: _audio_input(c, WAV))
    for door, answer in answers.items():
        try:
            _close(answer, expected)
        except AssertionError as exc:
            raise AssertionError(f"{door}: {answer} != {expected}") from exc


@pytest.mark.parametrize("model", ["asr", "kws"])
def test_samples_as_an_fp32_tensor(
    server: tuple[str, str], pipelines: dict[str, Any], model: str
) -> None:
    url, target = server
    row = tone(0.5, 440.0)  # at the model's rate: no sampling_rate needed
    expected = pipelines[model](row)
    by_json = _v2_json(
        url,
        model,
        [{"name": "samples", "datatype": "FP32", "shape": [1, len(row)], "data": row.tolist()}],
    )
    assert by_json.status_code == 200, by_json.text
    _close(orjson.loads(by_json.json()["outputs"][0]["data"][0]), expected)
    _close(_v2_http(url, model, lambda c: _samples_input(c, row, binary=True)), expected)
    _close(_v2_grpc(target, model, lambda c: _samples_input(c, row)), expected)
    plain = _plain(url, model, json={"inputs": [{"samples": row.tolist()}]})
    assert plain.status_code == 200, plain.text
    _close(plain.json()["outputs"][0], expected)


@pytest.mark.parametrize("model", ["asr", "kws", "whisper"])
def test_16_concurrent_requests_equal_their_single_answers_in_batches(
    server: tuple[str, str], model: str
) -> None:
    url, _ = server
    clips = [audio_file(tone(0.3 + 0.05 * index, 200.0 + 37 * index)) for index in range(16)]
    singles = [
        _plain(url, model, content=clip, headers={"Content-Type": "audio/wav"}) for clip in clips
    ]
    before = httpx.get(f"{url}/metrics").text
    count_before = sample(before, "batching_batch_size_items_count", model=model)
    singles_before = sample(before, "batching_batch_size_items_bucket", model=model, le="1.0")
    barrier = threading.Barrier(16)

    def send(clip: bytes) -> httpx.Response:
        barrier.wait()
        return _plain(url, model, content=clip, headers={"Content-Type": "audio/wav"})

    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(send, clips))
    for alone, batched in zip(singles, together, strict=True):
        assert batched.status_code == 200, batched.text
        _close(batched.json()["outputs"][0], alone.json()["outputs"][0])
    after = httpx.get(f"{url}/metrics").text
    batches = sample(after, "batching_batch_size_items_count", model=model) - count_before
    ones = sample(after, "batching_batch_size_items_bucket", model=model, le="1.0") - singles_before
    assert batches < 16 and ones < batches  # batches of more than one ran


def test_parameters_on_every_door(server: tuple[str, str], pipelines: dict[str, Any]) -> None:
    url, target = server
    row = tone(0.5, 440.0, 8_000)  # samples at 8 kHz, for a 16 kHz model
    heard = from_samples(row, 8_000, RATE, 30.0).samples
    expected = pipelines["kws"](heard, top_k=2)
    tensor = {"name": "samples", "datatype": "FP32", "shape": [1, len(row)], "data": row.tolist()}
    parameters = {"sampling_rate": 8_000, "top_k": 2}
    plain = _plain(
        url, "kws", json={"inputs": [{"samples": row.tolist()}], "parameters": parameters}
    )
    assert plain.status_code == 200, plain.text
    _close(plain.json()["outputs"][0], expected)
    v2 = _v2_json(url, "kws", [tensor], parameters=parameters)
    assert v2.status_code == 200, v2.text
    _close(orjson.loads(v2.json()["outputs"][0]["data"][0]), expected)
    with triton_http.InferenceServerClient(url.removeprefix("http://")) as client:
        result = client.infer("kws", [_samples_input(triton_http, row)], parameters=parameters)
        _close(_answer(result), expected)
    with triton_grpc.InferenceServerClient(target) as client:
        result = client.infer("kws", [_samples_input(triton_grpc, row)], parameters=parameters)
        _close(_answer(result), expected)
    # A file's own header gives its rate; a sampling_rate that contradicts it is refused.
    as_file = base64.b64encode(audio_file(row, 8_000)).decode()
    ok = _plain(url, "asr", json={"inputs": [as_file], "parameters": {"sampling_rate": 8_000}})
    assert ok.status_code == 200 and ok.json()["outputs"][0] == pipelines["asr"](heard)
    wrong = _plain(url, "asr", json={"inputs": [as_file], "parameters": {"sampling_rate": RATE}})
    assert wrong.status_code == 400 and "the file says 8000 Hz" in wrong.json()["error"]


def test_unknown_or_bad_parameters_are_a_400_naming_them(server: tuple[str, str]) -> None:
    url, target = server
    encoded = base64.b64encode(WAV).decode()
    tensor = {"name": "audio", "datatype": "BYTES", "shape": [1], "data": [encoded]}
    for parameters, named in (
        ({"top_k": 2}, "top_k"),
        ({"sampling_rate": 10}, "sampling_rate"),
        ({"sampling_rate": "fast"}, "sampling_rate"),
        ({"language": "en"}, "language"),
    ):
        plain = _plain(url, "asr", json={"inputs": [encoded], "parameters": parameters})
        assert plain.status_code == 400 and named in plain.json()["error"], plain.text
        v2 = _v2_json(url, "asr", [tensor], parameters=parameters)
        assert v2.status_code == 400 and named in v2.json()["error"], v2.text
        with pytest.raises(InferenceServerException) as refused:
            with triton_grpc.InferenceServerClient(target) as client:
                client.infer("asr", [_audio_input(triton_grpc, WAV)], parameters=parameters)
        assert str(refused.value.status()) == "StatusCode.INVALID_ARGUMENT"
        assert named in refused.value.message()


@pytest.fixture(scope="module")
def trap() -> Iterator[Trap]:
    with url_trap(WAV, "audio/wav", "speech.wav") as serving:
        yield serving


def _status(exc: InferenceServerException) -> int:
    status = str(exc.status())
    return {"StatusCode.INVALID_ARGUMENT": 400, "StatusCode.RESOURCE_EXHAUSTED": 413}.get(
        status, int(status) if status.isdigit() else -1
    )


def _refusals(url: str, target: str, model: str, value: bytes) -> list[tuple[str, int, str]]:
    """``value`` sent as the audio on every door: (door, status, message); the HTTP doors'
    bodies are JSON."""
    answers: list[tuple[str, int, str]] = []
    text = value.decode("latin-1")
    encoded = base64.b64encode(value).decode()
    requests = {
        "plain raw": lambda: _plain(
            url, model, content=value, headers={"Content-Type": "audio/wav"}
        ),
        "plain json": lambda: _plain(url, model, json={"inputs": [encoded]}),
        "plain json text": lambda: _plain(url, model, json={"inputs": [text]}),
        "v2 json": lambda: _v2_json(
            url, model, [{"name": "audio", "datatype": "BYTES", "shape": [1], "data": [encoded]}]
        ),
        "v2 json text": lambda: _v2_json(
            url, model, [{"name": "audio", "datatype": "BYTES", "shape": [1], "data": [text]}]
        ),
    }
    for door, call in requests.items():
        response = call()
        answers.append((door, response.status_code, response.json()["error"]))
    for door, call in (
        ("v2 binary", lambda: _v2_http(url, model, lambda c: _audio_input(c, value, True))),
        ("grpc", lambda: _v2_grpc(target, model, lambda c: _audio_input(c, value))),
    ):
        with pytest.raises(InferenceServerException) as refused:
            call()
        answers.append((door, _status(refused.value), refused.value.message()))
    return answers


def test_a_url_is_never_fetched(server: tuple[str, str], trap: Trap) -> None:
    url, target = server
    trap.seen.clear()
    for model in ("asr", "kws"):
        answers = _refusals(url, target, model, trap.url.encode())
        assert {status for _, status, _ in answers} == {400}, answers
        assert all("127.0.0.1" not in message for _, _, message in answers)
    assert trap.seen == []
    # The trap answers whoever asks: it would have been seen had the server fetched it.
    assert httpx.get(trap.url).content == WAV and trap.seen == ["/speech.wav"]


def test_a_path_is_never_opened(server: tuple[str, str], tmp_path: Path) -> None:
    url, target = server
    path = tmp_path / "speech.wav"
    path.write_bytes(WAV)
    opened: list[Any] = []

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and args and str(args[0]) == str(path):
            opened.append(args)

    sys.addaudithook(audit)  # hooks cannot be removed; this one only looks at one path
    for model in ("asr", "kws"):
        answers = _refusals(url, target, model, str(path).encode())
        assert {status for _, status, _ in answers} == {400}, answers
        assert all(str(tmp_path) not in message for _, _, message in answers)
    assert opened == []
    path.read_bytes()  # the hook sees a real open of that path
    assert opened


def test_undecodable_audio_is_a_400_on_every_door(server: tuple[str, str]) -> None:
    url, target = server
    for junk in (b"RIFF\x24\x00\x00\x00WAVEfmt this is not audio", WAV[:40], b"fLaC" + b"\0" * 60):
        answers = _refusals(url, target, "asr", junk)
        assert {status for _, status, _ in answers} == {400}, answers
        assert any("WAV or FLAC" in message for _, _, message in answers), answers


def _lying_flac(claimed_seconds: int) -> bytes:
    """A FLAC file cut after its first frames whose STREAMINFO claims ``claimed_seconds``."""
    data = bytearray(audio_file(tone(1.0, 300.0), RATE, "FLAC")[:2000])
    head = int.from_bytes(data[18:26], "big")
    data[18:26] = ((head & ~((1 << 36) - 1)) | claimed_seconds * RATE).to_bytes(8, "big")
    return bytes(data)


def test_too_long_audio_is_a_413_from_its_header_on_every_door(server: tuple[str, str]) -> None:
    url, target = server
    batches = sample(
        httpx.get(f"{url}/metrics").text, "batching_batch_size_items_count", model="kws"
    )
    # Its header alone says an hour: decoded, it would hold a fraction of a second, so the
    # 413 can only come from the header, before any decoding.
    for clip in (_lying_flac(3600), audio_file(tone(MAX_SECONDS + 0.5, 300.0))):
        answers = _refusals(url, target, "kws", clip)
        statuses = {door: status for door, status, _ in answers}
        # The text forms carry latin-1 text, not the file: they are 400s of their own.
        assert statuses.pop("plain json text") == 400 and statuses.pop("v2 json text") == 400
        # gRPC answers every PayloadTooLarge with INVALID_ARGUMENT (batching/grpc/errors.py).
        assert statuses.pop("grpc") == 400
        assert set(statuses.values()) == {413}, answers
        limit = f"at most {MAX_SECONDS:g} s (--max-audio-seconds)"
        assert all(limit in message for door, _, message in answers if "text" not in door)
    # Refused before they were queued: no batch ran.
    after = sample(
        httpx.get(f"{url}/metrics").text, "batching_batch_size_items_count", 0.0, model="kws"
    )
    assert after == batches
    row = tone(MAX_SECONDS + 0.5, 300.0)
    long_samples = _v2_json(
        url,
        "kws",
        [{"name": "samples", "datatype": "FP32", "shape": [1, len(row)], "data": row.tolist()}],
    )
    assert long_samples.status_code == 413 and "at most 2 s" in long_samples.json()["error"]


def test_bad_input_is_a_4xx_with_a_json_body(server: tuple[str, str]) -> None:
    url, target = server
    both = _plain(
        url, "asr", json={"inputs": [{"audio": base64.b64encode(WAV).decode(), "samples": [0.1]}]}
    )
    assert both.status_code == 400 and "exactly one of" in both.json()["error"]
    image = _plain(url, "asr", content=b"\x89PNG\r\n", headers={"Content-Type": "image/png"})
    assert image.status_code == 400 and "audio/*" in image.json()["error"]
    ints = _v2_json(
        url, "asr", [{"name": "samples", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}]
    )
    assert 400 <= ints.status_code < 500 and "floats" in ints.json()["error"]
    nan = _plain(url, "kws", content=b'{"inputs": [{"samples": [0.1, NaN]}]}')
    assert 400 <= nan.status_code < 500 and nan.json()["error"]
    empty = _v2_json(
        url, "asr", [{"name": "audio", "datatype": "BYTES", "shape": [1], "data": [""]}]
    )
    assert empty.status_code == 400 and "empty" in empty.json()["error"]
    with pytest.raises(InferenceServerException) as refused:
        with triton_grpc.InferenceServerClient(target) as client:
            tensor = triton_grpc.InferInput("samples", [1, 3], "INT32")
            tensor.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.int32))
            client.infer("asr", [tensor])
    assert str(refused.value.status()) == "StatusCode.INVALID_ARGUMENT"
    assert "floats" in refused.value.message()


@pytest.mark.anyio
async def test_a_model_that_cannot_hear_a_second_of_audio_never_reports_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="batching")
    # Its feature encoder's one convolution is wider than the warm-up's second of sine: the
    # folder loads, but the model cannot serve, and only the warm-up can tell.
    folder = tmp_path / "wide"
    torch.manual_seed(5)
    config = wav2vec2_config(conv_dim=(16,), conv_stride=(1,), conv_kernel=(RATE * 2,))
    transformers.Wav2Vec2ForSequenceClassification(config).save_pretrained(folder)
    classifier_folder(tmp_path, "parts")
    (folder / "preprocessor_config.json").write_bytes(
        (tmp_path / "parts" / "preprocessor_config.json").read_bytes()
    )
    model = AudioModel(CLASSIFY, folder)
    model.load("cpu")  # it loads
    failed = asyncio.Event()
    app = create_app(
        ModelConfig(name="wide", source=str(folder), task=CLASSIFY),
        on_load_failure=lambda *_: failed.set(),
    )
    async with serving(app, wait_ready=False) as client:
        await asyncio.wait_for(failed.wait(), 60)
        assert (await client.get("/v2/models/wide/ready")).status_code != 200
        index = (await client.post("/v2/repository/index")).json()
    assert index[0]["state"] == "UNAVAILABLE"
    assert "RuntimeError" in index[0]["reason"]
    assert any("warm-up batch 1" in record.getMessage() for record in caplog.records)


def test_metadata_and_config_describe_both_inputs(server: tuple[str, str]) -> None:
    url, target = server
    with triton_http.InferenceServerClient(url.removeprefix("http://")) as client:
        metadata = client.get_model_metadata("kws")
        config = client.get_model_config("kws")
    assert [(tensor["name"], tensor["datatype"]) for tensor in metadata["inputs"]] == [
        ("audio", "BYTES"),
        ("samples", "FP32"),
    ]
    assert [tensor["name"] for tensor in config["input"]] == ["audio", "samples"]
    described = httpx.get(f"{url}/v2/models/kws").json()
    assert [tensor["shape"] for tensor in described["inputs"]] == [[-1, 1], [-1, -1]]
    assert sorted(described["parameters"]) == ["function_to_apply", "sampling_rate", "top_k"]
    with triton_grpc.InferenceServerClient(target) as client:
        grpc_metadata = client.get_model_metadata("asr", as_json=True)
    assert [tensor["name"] for tensor in grpc_metadata["inputs"]] == ["audio", "samples"]
