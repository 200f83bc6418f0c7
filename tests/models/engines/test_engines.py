"""Every engine on tiny random BERTs made in a temporary folder: outputs match torch fp32, the
export cache is reused and invalidated, a broken export falls back to torch, and the choice
is served (metadata, configuration, metric) by thread and process instances."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from batching import create_app
from batching.model_config import BatchingConfig, ModelConfig
from batching.models.embedding.sentence import SentenceEmbedder
from batching.models.engines import export, trials
from batching.models.engines.cache import EngineCache
from batching.models.engines.engine_options import EngineOptions
from batching.models.text.pipeline import PipelineModel
from tests.support.servers import running
from tests.support.tiny import classifier_folder, encoder_folder, masked_folder, sentence_folder

TEXTS = ["the cat sat on the mat", "a dog", "what where who eats fish and sleeps very fast"]
PAIRS: list[Any] = [
    "very good movie",
    {"text": "a dog", "text_pair": "the cat sat on the mat"},
    {"text": "red house"},
]
FP32 = [("onnxruntime", "fp32"), ("openvino", "fp32")]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engines")
    return {
        "st": sentence_folder(root),
        "base": encoder_folder(root),
        "classifier": classifier_folder(root, "classifier", ["neg", "pos"]),
        "masked": masked_folder(root),
    }


def options(tmp_path: Path, engine: str, precision: str = "fp32") -> EngineOptions:
    return EngineOptions(engine, precision, str(tmp_path / "cache"), (1, 4), "tiny")


def loaded(model: Any) -> Any:
    model.load("cpu")
    return model


@pytest.mark.parametrize(("engine", "precision"), FP32)
def test_the_sentence_embedder_matches_torch_on_every_engine(
    folders: dict[str, Path], tmp_path: Path, engine: str, precision: str
) -> None:
    expected = loaded(SentenceEmbedder(folders["st"])).predict(TEXTS)
    model = loaded(SentenceEmbedder(folders["st"], engine=options(tmp_path, engine, precision)))
    assert model.metadata()["engine"]["routes"] == [
        {"engine": engine, "precision": precision, "batch_sizes": [1, 4]}
    ]
    np.testing.assert_allclose(model.predict(TEXTS), expected, atol=1e-4)
    np.testing.assert_allclose(model.predict(TEXTS[1:2]), expected[1:2], atol=1e-4)


@pytest.mark.parametrize(("engine", "precision"), FP32)
def test_feature_extraction_matches_torch_on_every_engine(
    folders: dict[str, Path], tmp_path: Path, engine: str, precision: str
) -> None:
    expected = loaded(PipelineModel("feature-extraction", folders["base"])).predict(TEXTS)
    model = PipelineModel(
        "feature-extraction", folders["base"], engine=options(tmp_path, engine, precision)
    )
    np.testing.assert_allclose(loaded(model).predict(TEXTS), expected, atol=1e-4)


@pytest.mark.parametrize(("engine", "precision"), FP32)
def test_text_classification_with_pairs_matches_torch_on_every_engine(
    folders: dict[str, Path], tmp_path: Path, engine: str, precision: str
) -> None:
    expected = loaded(PipelineModel("text-classification", folders["classifier"]))
    model = PipelineModel(
        "text-classification", folders["classifier"], engine=options(tmp_path, engine, precision)
    )
    loaded(model)
    assert model.metadata()["engine"]["engine"] == engine
    for want, got in zip(expected.predict(PAIRS), model.predict(PAIRS), strict=True):
        assert got["label"] == want["label"]
        assert got["score"] == pytest.approx(want["score"], abs=1e-4)


@pytest.mark.parametrize(("engine", "precision"), FP32)
def test_fill_mask_matches_torch_on_every_engine(
    folders: dict[str, Path], tmp_path: Path, engine: str, precision: str
) -> None:
    texts = ["the [MASK] sat on the mat", "a [MASK]"]
    expected = loaded(PipelineModel("fill-mask", folders["masked"])).predict(texts)
    model = PipelineModel(
        "fill-mask", folders["masked"], engine=options(tmp_path, engine, precision)
    )
    for want, got in zip(expected, loaded(model).predict(texts), strict=True):
        assert [c["token_str"] for c in got] == [c["token_str"] for c in want]
        assert [c["score"] for c in got] == pytest.approx([c["score"] for c in want], abs=1e-4)


def test_auto_measures_every_variant_and_serves_an_accurate_one(
    folders: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected = loaded(SentenceEmbedder(folders["st"])).predict(TEXTS)
    with caplog.at_level(logging.INFO, logger="batching"):
        model = loaded(SentenceEmbedder(folders["st"], engine=options(tmp_path, "auto", "auto")))
    engine = model.metadata()["engine"]
    tried = {m["engine"] + "-" + m["precision"]: m for m in engine["measurements"]}
    assert set(tried) == {
        "torch-fp32",
        "torch-bf16",
        "onnxruntime-fp32",
        "openvino-fp32",
        "openvino-bf16",
    }
    for measurement in tried.values():
        usable = measurement["error"] is None
        assert usable == bool(measurement["items_per_s"]), measurement
        if usable:
            assert set(measurement["items_per_s"]) == {"1", "4"}
            assert measurement["accuracy"] >= 0.9999
    # Whatever won on this CPU, it matches torch fp32 as the check promises.
    vectors = model.predict(TEXTS)
    assert (vectors * expected).sum(axis=1).min() >= 0.9999
    messages = [record.getMessage() for record in caplog.records]
    assert any("checking torch-fp32, torch-bf16" in message for message in messages)
    assert any(message.startswith("model tiny: engine ") for message in messages)


def test_a_variant_far_slower_at_batch_1_is_dropped_without_its_accuracy_check(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timed: list[int] = []

    def rate(run: Any, size: int, *args: Any) -> float:
        run()
        timed.append(size)
        # The first variant screened at batch 1 is fast; every later one is slow.
        return 1000.0 if len(timed) <= 1 else 1.0

    checked: list[str] = []
    compare = trials.compare

    def counted(measure: str, expected: Any, outputs: Any) -> Any:
        checked.append(measure)
        return compare(measure, expected, outputs)

    monkeypatch.setattr(trials, "items_per_second", rate)
    monkeypatch.setattr(trials, "compare", counted)
    model = loaded(SentenceEmbedder(folders["st"], engine=options(tmp_path, "auto", "fp32")))
    measurements = model.metadata()["engine"]["measurements"]
    assert len(checked) == 1
    assert timed == [1, 1, 1]  # openvino, then onnxruntime and torch (batch 4: interleaved)
    dropped = [m for m in measurements if m["error"] is not None]
    assert len(dropped) == len(measurements) - 1 == 2
    for measurement in dropped:
        assert "over 2x slower than" in measurement["error"]
        assert measurement["accuracy"] is None and not measurement["items_per_s"]


def test_the_export_is_cached_and_a_changed_model_file_exports_again(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "st"
    folder.mkdir()
    for path in folders["st"].rglob("*"):
        target = folder / path.relative_to(folders["st"])
        if path.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.write_bytes(path.read_bytes())
    exports: list[Path] = []
    real = export.export_onnx

    def counted(*args: Any) -> None:
        exports.append(args[-1])
        real(*args)

    monkeypatch.setattr(export, "export_onnx", counted)
    first = loaded(SentenceEmbedder(folder, engine=options(tmp_path, "onnxruntime")))
    loaded(SentenceEmbedder(folder, engine=options(tmp_path, "onnxruntime")))
    assert len(exports) == 1
    # One folder per model (beside them, digests.json remembers the model files' hashes).
    cached = [path for path in (tmp_path / "cache").iterdir() if path.is_dir()]
    assert len(cached) == 1 and (cached[0] / "onnx" / export.PLAIN).is_file()
    # A new measurement is not needed either: the decision was kept beside the export.
    assert len(list((cached[0] / "decisions").iterdir())) == 1
    assert first.metadata()["engine"]["reused_from_cache"] is False

    config = json.loads((folder / "config.json").read_text())
    config["layer_norm_eps"] = 1e-6
    (folder / "config.json").write_text(json.dumps(config))
    again = loaded(SentenceEmbedder(folder, engine=options(tmp_path, "onnxruntime")))
    assert len(exports) == 2
    assert len([path for path in (tmp_path / "cache").iterdir() if path.is_dir()]) == 2
    np.testing.assert_allclose(
        again.predict(TEXTS), loaded(SentenceEmbedder(folder)).predict(TEXTS), atol=1e-4
    )


def test_a_reused_decision_is_not_measured_again(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = loaded(SentenceEmbedder(folders["st"], engine=options(tmp_path, "auto", "fp32")))

    def no_timing(*args: Any) -> float:
        raise AssertionError("measured again")

    monkeypatch.setattr(trials, "items_per_second", no_timing)
    second = loaded(SentenceEmbedder(folders["st"], engine=options(tmp_path, "auto", "fp32")))
    assert second.metadata()["engine"]["reused_from_cache"] is True
    assert second.metadata()["engine"]["routes"] == first.metadata()["engine"]["routes"]


def test_a_broken_export_falls_back_to_torch_with_one_line(
    folders: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("this architecture does not trace")

    monkeypatch.setattr(export, "export_onnx", broken)
    expected = loaded(SentenceEmbedder(folders["st"])).predict(TEXTS)
    with caplog.at_level(logging.INFO, logger="batching"):
        model = loaded(SentenceEmbedder(folders["st"], engine=options(tmp_path, "openvino")))
    assert model.metadata()["engine"]["routes"][0]["engine"] == "torch"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "model tiny: falling back to torch fp32: openvino-fp32: export failed: RuntimeError: "
        "this architecture does not trace"
    ]
    np.testing.assert_allclose(model.predict(TEXTS), expected, atol=1e-6)


def test_two_instances_exporting_at_once_export_once(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    cache = EngineCache(tmp_path, folders["st"], "base")
    made: list[Path] = []
    started = threading.Barrier(2)
    results: list[tuple[Path, bool]] = []

    def make(out: Path) -> None:
        made.append(out)
        (out / "model.onnx").write_bytes(b"graph")

    def instance() -> None:
        started.wait()
        with cache.locked():
            results.append(cache.export(make))

    threads = [threading.Thread(target=instance) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1
    assert sorted(reused for _, reused in results) == [False, True]
    assert [p.name for p in cache.folder.iterdir() if p.name.startswith(".")] == []


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["thread", "process"])
async def test_instances_serve_the_engine_and_report_it(
    folders: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    expected = loaded(SentenceEmbedder(folders["st"])).predict(TEXTS)
    config = ModelConfig(
        name="tiny",
        source=str(folders["st"]),
        engine="openvino",
        precision="fp32",
        engine_cache=str(tmp_path / "cache"),
        instance_kind=kind,
        batching=BatchingConfig(max_batch_size=4),
    )
    async with running(create_app(config)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            answer = (await client.post("/", json={"inputs": TEXTS})).json()
            metadata = (await client.get("/v2/models/tiny")).json()
            parameters = (await client.get("/v2/models/tiny/config")).json()["parameters"]
            metrics = (await client.get("/metrics")).text
    np.testing.assert_allclose(np.array(answer["outputs"]), expected, atol=1e-4)
    assert metadata["engine"]["routes"] == [
        {"engine": "openvino", "precision": "fp32", "batch_sizes": [1, 4]}
    ]
    assert parameters["engine"] == {"string_value": "openvino"}
    assert parameters["precision"] == {"string_value": "fp32"}
    decision = json.loads(parameters["engine_decision"]["string_value"])
    assert decision["measurements"][0]["items_per_s"].keys() == {"1", "4"}
    assert (
        'batching_model_engine_info{batch_sizes="1-4",engine="openvino",model="tiny",'
        'precision="fp32"} 1.0' in metrics
    )


def test_unloading_an_engine_backed_model_closes_its_plan(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    # A closed plan stops its idle release and its retake (test_engine_retake): an unloaded
    # model measures nothing more, and holds no loading turn that a later load waits behind.
    embedder = loaded(SentenceEmbedder(folders["st"], engine=options(tmp_path, "onnxruntime")))
    classifier = loaded(
        PipelineModel(
            "text-classification", folders["classifier"], engine=options(tmp_path, "onnxruntime")
        )
    )
    plans = [embedder._model, classifier._plan]
    assert all(plan is not None and not plan.closed.is_set() for plan in plans)
    embedder.unload()
    classifier.unload()
    assert all(plan is not None and plan.closed.is_set() for plan in plans)
