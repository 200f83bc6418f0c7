"""Audio of many channels at a high rate, on every door of a real server on 127.0.0.1 (a tiny
Wav2Vec2 audio classifier): a 32-channel, 384 kHz WAV and an 8-channel, 384 kHz FLAC inside
the length limit are answered as the pipeline answers their mono mix (read whole, resampled
in one call), though the server decodes them a block at a time; one over the limit is a 413
naming ``--max-audio-seconds`` (``INVALID_ARGUMENT`` over gRPC). What the decoding costs in
memory is measured in ``tests/models/shared/test_decode_memory.py``."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import soundfile
import soxr
import transformers
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.audio import RATE, classifier_folder
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread

MAX_SECONDS = 2.0
HIGH = 384_000


def _many_channels(seconds: float, channels: int, form: str) -> bytes:
    """A tone in the first channel, quieter ones in a few others, silence in the rest."""
    frames = round(seconds * HIGH)
    times = np.arange(frames) / HIGH
    samples = np.zeros((frames, channels), dtype=np.float32)
    for channel, frequency in zip(range(0, channels, 3), (330.0, 550.0, 770.0), strict=False):
        samples[:, channel] = 0.4 / (1 + channel) * np.sin(2 * np.pi * frequency * times)
    out = io.BytesIO()
    soundfile.write(out, samples, HIGH, format=form, subtype="PCM_16")
    return out.getvalue()


def _heard(data: bytes) -> np.ndarray:
    """The mono mix at the model's rate, the plain way: every sample read, one resampling."""
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    mono = samples.mean(axis=1, dtype=np.float32)
    return np.asarray(soxr.resample(mono, rate, RATE, quality="HQ"), dtype=np.float32)


#: 12.3 MB of WAV, and a FLAC of a few hundred KB that decodes to 5.8 million samples.
WAV = _many_channels(0.5, 32, "WAV")
FLAC = _many_channels(1.9, 8, "FLAC")
TOO_LONG = _many_channels(MAX_SECONDS + 0.2, 8, "FLAC")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return classifier_folder(tmp_path_factory.mktemp("audio-budget"))


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[tuple[str, str]]:
    grpc_port = free_port()
    config = ModelConfig(
        name="kws",
        source=str(folder),
        task="audio-classification",
        batching=BatchingConfig(max_batch_size=4),
        max_audio_seconds=MAX_SECONDS,
    )
    app = create_app(config, grpc_port=grpc_port, max_body_bytes=32 << 20)
    with serving_in_thread(app, timeout=120) as url:
        yield url, f"127.0.0.1:{grpc_port}"


def _infer(client: Any, module: Any, data: bytes) -> Any:
    tensor = module.InferInput("audio", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([data], dtype=object))
    return orjson.loads(client.infer("kws", [tensor]).as_numpy("output").reshape(-1)[0])


def _doors(server: tuple[str, str], data: bytes, form: str) -> dict[str, Any]:
    """``data`` sent raw, as a v2 binary tensor and over gRPC: each door's answer."""
    url, target = server
    raw = httpx.post(
        f"{url}/models/kws", content=data, headers={"Content-Type": f"audio/{form}"}, timeout=60
    )
    answers: dict[str, Any] = {"plain": raw}
    with triton_http.InferenceServerClient(url.removeprefix("http://")) as client:
        answers["v2 binary"] = _infer(client, triton_http, data)
    with triton_grpc.InferenceServerClient(target) as client:
        answers["grpc"] = _infer(client, triton_grpc, data)
    return answers


@pytest.mark.parametrize(("data", "form"), [(WAV, "wav"), (FLAC, "flac")], ids=["wav", "flac"])
def test_many_channels_at_384_khz_are_answered_as_the_pipeline_answers_their_mix(
    server: tuple[str, str], folder: Path, data: bytes, form: str
) -> None:
    pipe = transformers.pipeline("audio-classification", model=str(folder))
    want = pipe(_heard(data), top_k=None)
    answers = _doors(server, data, form)
    plain = answers.pop("plain")
    assert plain.status_code == 200, plain.text
    for door, got in {"plain": plain.json()["outputs"][0], **answers}.items():
        assert [row["label"] for row in got] == [row["label"] for row in want], door
        np.testing.assert_allclose(
            [row["score"] for row in got], [row["score"] for row in want], atol=1e-4
        )


def test_many_channels_over_the_length_limit_are_a_413_on_every_door(
    server: tuple[str, str],
) -> None:
    url, target = server
    raw = httpx.post(
        f"{url}/models/kws", content=TOO_LONG, headers={"Content-Type": "audio/flac"}, timeout=60
    )
    assert raw.status_code == 413
    messages = [raw.json()["error"]]
    with (
        triton_http.InferenceServerClient(url.removeprefix("http://")) as client,
        pytest.raises(InferenceServerException) as binary,
    ):
        _infer(client, triton_http, TOO_LONG)
    assert binary.value.status() == "413"
    with (
        triton_grpc.InferenceServerClient(target) as client,
        pytest.raises(InferenceServerException) as over_grpc,
    ):
        _infer(client, triton_grpc, TOO_LONG)
    assert str(over_grpc.value.status()) == "StatusCode.INVALID_ARGUMENT"
    messages += [binary.value.message(), over_grpc.value.message()]
    assert all("at most 2 s (--max-audio-seconds)" in message for message in messages), messages
