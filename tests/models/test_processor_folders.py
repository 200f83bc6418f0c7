"""Folders whose feature extractor or image processor was saved inside a processor
(``Wav2Vec2Processor``, ``CLIPProcessor``, ... ``.save_pretrained``): transformers 5 writes
``processor_config.json`` with it nested and no ``preprocessor_config.json``, and loads the
folder; so does the server, for the audio and the image tasks. A folder with neither file is
refused at start in one line naming both."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from batching import ModelConfig, create_app
from batching.models.processors import (
    FEATURE_EXTRACTOR,
    IMAGE_PROCESSOR,
    PREPROCESSOR_FILE,
    PROCESSOR_FILE,
    processor_settings,
)
from batching.models.source import ModelSource
from tests.support.asgi import serving
from tests.support.audio import audio_file, ctc_folder, tone
from tests.support.servers import free_port
from tests.support.vision import classifier_folder, clip_folder, png

ROOT = Path(__file__).resolve().parents[2]
ASR = "automatic-speech-recognition"


def _pil(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("processors")
    return {
        "asr": ctc_folder(root, "asr", processor=True),
        "vit": classifier_folder(root, "vit", processor=True),
        "clip": clip_folder(root, "clip", processor=True),
    }


@pytest.mark.parametrize(
    ("name", "kind"),
    [("asr", FEATURE_EXTRACTOR), ("vit", IMAGE_PROCESSOR), ("clip", IMAGE_PROCESSOR)],
)
def test_a_processor_saved_whole_writes_its_part_into_processor_config_only(
    folders: dict[str, Path], name: str, kind: str
) -> None:
    folder = folders[name]
    assert not (folder / PREPROCESSOR_FILE).exists()
    nested = json.loads((folder / PROCESSOR_FILE).read_text())
    assert isinstance(nested[kind], dict)
    assert processor_settings(folder, kind) == nested[kind]


def test_the_nested_entry_wins_over_preprocessor_config_as_in_transformers(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "both"
    shutil.copytree(folders["asr"], folder)
    (folder / PREPROCESSOR_FILE).write_text(json.dumps({"sampling_rate": 8000}))
    nested = json.loads((folder / PROCESSOR_FILE).read_text())[FEATURE_EXTRACTOR]
    assert processor_settings(folder, FEATURE_EXTRACTOR) == nested
    loaded = transformers.AutoFeatureExtractor.from_pretrained(str(folder))
    assert loaded.sampling_rate == nested["sampling_rate"] == 16_000


@pytest.mark.anyio
async def test_speech_recognition_serves_a_wav2vec2_processor_folder(
    folders: dict[str, Path],
) -> None:
    folder = folders["asr"]
    assert ModelSource.parse(str(folder), ASR).task == ASR
    samples = tone(0.6, 440.0)
    want = transformers.pipeline(ASR, model=str(folder))(samples.copy())
    app = create_app(ModelConfig(name="asr", source=str(folder), task=ASR))
    async with serving(app) as client:
        answer = await client.post(
            "/models/asr", content=audio_file(samples), headers={"Content-Type": "audio/wav"}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"] == [{"text": want["text"]}]


@pytest.mark.anyio
async def test_image_classification_serves_an_image_processor_saved_in_a_processor(
    folders: dict[str, Path],
) -> None:
    folder = folders["vit"]
    image = png(40, 30, 1)
    pipe = transformers.pipeline("image-classification", model=str(folder))
    want = pipe(_pil(image))
    app = create_app(ModelConfig(name="vit", source=str(folder), task="image-classification"))
    async with serving(app) as client:
        answer = await client.post(
            "/models/vit", content=image, headers={"Content-Type": "image/png"}
        )
        assert answer.status_code == 200, answer.text
        (got,) = answer.json()["outputs"]
    assert [row["label"] for row in got] == [row["label"] for row in want]
    np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in want], atol=1e-4)


@pytest.mark.anyio
async def test_image_text_embedding_serves_a_clip_processor_folder(
    folders: dict[str, Path],
) -> None:
    folder = folders["clip"]
    model = transformers.CLIPModel.from_pretrained(str(folder)).eval()
    image = png(40, 30, 2)
    processed = transformers.AutoImageProcessor.from_pretrained(str(folder))(
        images=_pil(image), return_tensors="pt"
    )
    with torch.inference_mode():
        features = model.get_image_features(**processed)
    pooled = getattr(features, "pooler_output", features)
    app = create_app(ModelConfig(name="clip", source=str(folder), task="image-text-embedding"))
    async with serving(app) as client:
        answer = await client.post(
            "/models/clip", content=image, headers={"Content-Type": "image/png"}
        )
        assert answer.status_code == 200, answer.text
        text = await client.post("/models/clip", json={"inputs": ["a photo of the cat"]})
        assert text.status_code == 200, text.text
    np.testing.assert_allclose(answer.json()["outputs"][0], pooled[0].numpy(), atol=1e-4)


@pytest.mark.parametrize(
    ("source", "task", "kind"),
    [
        ("asr", ASR, FEATURE_EXTRACTOR),
        ("asr", "audio-classification", FEATURE_EXTRACTOR),
        ("vit", "image-classification", IMAGE_PROCESSOR),
        ("clip", "image-text-embedding", IMAGE_PROCESSOR),
    ],
)
def test_a_folder_with_neither_processor_file_is_refused_in_one_line_naming_both(
    folders: dict[str, Path], tmp_path: Path, source: str, task: str, kind: str
) -> None:
    folder = tmp_path / "bare"
    shutil.copytree(folders[source], folder)
    # A processor_config.json without the part the task needs counts as none.
    (folder / PROCESSOR_FILE).write_text(json.dumps({"processor_class": "Processor"}))
    finished = subprocess.run(
        [sys.executable, "server.py", "--port", str(free_port()), "--model", str(folder)]
        + ["--task", task],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert finished.returncode == 2
    assert finished.stderr.count("\n") == 1, finished.stderr
    assert finished.stderr == (
        f"server.py: error: bare has neither {PREPROCESSOR_FILE} nor {PROCESSOR_FILE} with its "
        f"{kind} entry: --task {task} needs the model's {kind.replace('_', ' ')}; save it (or "
        "the model's processor) beside the weights with save_pretrained\n"
    )
