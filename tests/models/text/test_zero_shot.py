"""zero-shot-classification: per-request candidate labels, one (text, label) pair per unit of
batching, answers equal to ``transformers.pipeline("zero-shot-classification")``; on a tiny NLI
model built from a config, through the model and the data plane."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import transformers

from batching import BatchingConfig, ModelConfig
from batching.errors import InvalidRequest, PayloadTooLarge
from batching.metrics import Metrics
from batching.models.engines.engine_options import EngineOptions
from batching.models.parameters import TaskItem, check_parameters
from batching.models.source import ModelSource, ModelSourceError
from batching.models.text.nli import ZERO_SHOT_PARAMETERS, nli_logit_ids
from batching.models.text.zero_shot import ZeroShotModel
from batching.plane import Caller, DataPlane, Deployments
from batching.runtime.deployment import Deployment
from batching.runtime.warmup import WarmupPlan, load_and_warm
from tests.support.tiny import classifier_folder

TASK = "zero-shot-classification"
TEXTS = ["the cat sat on the mat", "i like it", "a red house with a green tree", "dog"]
LABELS = ["cat", "dog", "red house", "fish", "good movie", "tree", "blue", "sleeps", "bad", "mat"]
#: Contradiction and entailment in another order than [contradiction, neutral, entailment].
NLI_LABELS = ["entailment", "neutral", "contradiction"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return classifier_folder(tmp_path_factory.mktemp("nli"), "nli", NLI_LABELS, seed=7)


@pytest.fixture(scope="module")
def reference(folder: Path) -> Any:
    return transformers.pipeline(TASK, model=str(folder), device="cpu")


@pytest.fixture(scope="module")
def model(folder: Path) -> Iterator[ZeroShotModel]:
    built = ZeroShotModel(TASK, folder)
    built.load("cpu")
    yield built


def item(text: str, **given: Any) -> TaskItem:
    return TaskItem(text, check_parameters(ZERO_SHOT_PARAMETERS, given))


def answer(model: ZeroShotModel, request: TaskItem) -> Any:
    return model.join(request, list(model.predict(model.expand(request))))


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["sequence"] == want["sequence"]
    assert got["labels"] == want["labels"]
    assert got["scores"] == pytest.approx(want["scores"], abs=1e-4)


@pytest.mark.parametrize("multi_label", [False, True])
@pytest.mark.parametrize("text", TEXTS)
def test_answers_equal_the_pipeline(
    model: ZeroShotModel, reference: Any, text: str, multi_label: bool
) -> None:
    labels = LABELS[:5]
    got = answer(model, item(text, candidate_labels=labels, multi_label=multi_label))
    assert_same(got, reference(text, candidate_labels=labels, multi_label=multi_label))
    if not multi_label:
        assert sum(got["scores"]) == pytest.approx(1.0, abs=1e-5)


def test_one_label_and_a_template_equal_the_pipeline(model: ZeroShotModel, reference: Any) -> None:
    template = "the {} is good"
    for labels in (["cat"], ["cat", "fish"]):
        got = answer(model, item(TEXTS[0], candidate_labels=labels, hypothesis_template=template))
        assert_same(got, reference(TEXTS[0], candidate_labels=labels, hypothesis_template=template))


def test_a_long_text_is_cut_not_its_hypothesis(model: ZeroShotModel, reference: Any) -> None:
    text = " ".join(["the cat sat on the mat"] * 30)  # far over the 64 positions
    got = answer(model, item(text, candidate_labels=["cat", "dog"]))
    # The pipeline cuts only the text too (at the tokenizer's limit, which the tiny one lacks).
    reference.tokenizer.model_max_length = model.max_seq_length
    assert_same(got, reference(text, candidate_labels=["cat", "dog"]))


def test_each_label_is_one_pair_unit(model: ZeroShotModel) -> None:
    units = model.expand(item("i like it", candidate_labels=["cat", "dog"]))
    assert units == [
        {"text": "i like it", "text_pair": "This example is cat."},
        {"text": "i like it", "text_pair": "This example is dog."},
    ]
    # Token-aware packing counts each pair as one sequence pair: [CLS] text [SEP] hyp [SEP].
    assert [model.count_tokens(unit) for unit in units] == [3 + 3 + 5] * 2


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({}, "candidate_labels"),
        ({"candidate_labels": ["a"], "hypothesis_template": "no slot"}, "hypothesis_template"),
        ({"candidate_labels": ["a"], "hypothesis_template": "{} and {}"}, "hypothesis_template"),
        ({"candidate_labels": ["a"], "hypothesis_template": "{label} is"}, "hypothesis_template"),
        ({"candidate_labels": [" ".join(["cat"] * 40)]}, "candidate label"),
    ],
)
def test_bad_requests_are_refused_by_name(
    model: ZeroShotModel, given: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        model.expand(TaskItem("i like it", tuple(sorted(given.items()))))


def test_the_logits_come_from_label2id() -> None:
    assert nli_logit_ids({"label2id": {"contradiction": 0, "neutral": 1, "entailment": 2}}) == (
        0,
        2,
    )
    assert nli_logit_ids({"label2id": {"ENTAILMENT": 0, "neutral": 1, "contradiction": 2}}) == (
        2,
        0,
    )
    with pytest.raises(ValueError, match="entailment label"):
        nli_logit_ids({"label2id": {"LABEL_0": 0, "LABEL_1": 1}})


def test_a_model_without_entailment_is_refused_at_start(tmp_path: Path) -> None:
    sentiment = classifier_folder(tmp_path, "sentiment", ["negative", "positive"])
    with pytest.raises(ModelSourceError, match="entailment") as refused:
        ModelSource.parse(str(sentiment), TASK)
    assert "\n" not in str(refused.value)
    nli = classifier_folder(tmp_path, "nli", NLI_LABELS)
    assert isinstance(ModelSource.parse(str(nli), TASK).build(), ZeroShotModel)


def test_warm_up_runs_a_text_and_labels_as_a_request_does(folder: Path) -> None:
    seen: list[int] = []

    class Counted(ZeroShotModel):
        def predict(self, inputs: list[Any]) -> Any:
            seen.append(len(inputs))
            return super().predict(inputs)

    info = load_and_warm(Counted(TASK, folder), "cpu", 8, warmup=WarmupPlan(required=True))
    # Two labels of one text are two pairs; then one pair at batch 1 and at the cap.
    assert (info.warmup_batches, seen) == (3, [2, 1, 8])
    # The repository's parameters run in one more batch: ones the model cannot apply stop
    # the start, so the model never reports ready.
    labels = (("candidate_labels", ("a", "b", "c")),)
    info = load_and_warm(Counted(TASK, folder), "cpu", 8, warmup=WarmupPlan(parameters=labels))
    assert info.warmup_batches == 4 and seen[-1] == 3
    bad = (*labels, ("hypothesis_template", "no slot"))
    with pytest.raises(RuntimeError, match="hypothesis_template"):
        load_and_warm(Counted(TASK, folder), "cpu", 8, warmup=WarmupPlan(parameters=bad))
    # Generated texts take the repository's labels; without any they cannot be classified.
    random = WarmupPlan(data="random", parameters=labels)
    assert load_and_warm(Counted(TASK, folder), "cpu", 2, warmup=random).warmup_batches == 3
    with pytest.raises(RuntimeError, match="candidate_labels"):
        load_and_warm(Counted(TASK, folder), "cpu", 2, warmup=WarmupPlan(data="random"))


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino"])
def test_the_pairs_run_on_the_chosen_engine(
    folder: Path, model: ZeroShotModel, tmp_path: Path, engine: str
) -> None:
    options = EngineOptions(engine, "fp32", str(tmp_path / "cache"), (1, 4), "tiny")
    exported = ZeroShotModel(TASK, folder, engine=options)
    exported.load("cpu")
    assert exported.metadata()["engine"]["engine"] == engine
    for text in TEXTS[:2]:
        request = item(text, candidate_labels=LABELS[:6], multi_label=text == TEXTS[0])
        assert_same(answer(exported, request), answer(model, request))
    assert exported._plan is not None
    exported.unload()  # its plan's background threads stop
    assert exported._plan.closed.is_set()


# -- through the data plane ------------------------------------------------------------------


async def started(folder: Path, **batching: Any) -> tuple[DataPlane, Deployment, Metrics]:
    config = ModelConfig(
        name="zs",
        source=str(folder),
        task=TASK,
        batching=BatchingConfig(**batching),
        engine="torch",
        precision="fp32",
    )
    metrics = Metrics()
    ready = asyncio.Event()
    deployment = Deployment(
        config,
        lambda: ZeroShotModel(TASK, folder),
        events=metrics.for_model("zs"),
        on_ready=lambda *_: ready.set(),
        on_load_failure=lambda _deployment, _index, reason: pytest.fail(reason),
    )
    deployment.start()
    await asyncio.wait_for(ready.wait(), 60)
    return DataPlane(Deployments([deployment]), metrics), deployment, metrics


def batch_sizes(metrics: Metrics) -> tuple[float, float, float]:
    """Batches run, items in them, and batches of one item."""
    registry = metrics.registry
    count = registry.get_sample_value("batching_batch_size_items_count", {"model": "zs"})
    total = registry.get_sample_value("batching_batch_size_items_sum", {"model": "zs"})
    ones = registry.get_sample_value(
        "batching_batch_size_items_bucket", {"model": "zs", "le": "1.0"}
    )
    return count or 0.0, total or 0.0, ones or 0.0


@pytest.mark.anyio
async def test_concurrent_requests_share_batches_and_equal_their_single_answers(
    folder: Path, model: ZeroShotModel
) -> None:
    plane, deployment, metrics = await started(folder, max_batch_size=64, max_queue_delay=0.05)
    try:
        requests = [
            item(
                TEXTS[i % len(TEXTS)],
                candidate_labels=LABELS[i % 7 : i % 7 + 1 + i % 4],
                multi_label=i % 3 == 0,
            )
            for i in range(16)
        ]
        answers = await asyncio.gather(*(plane.infer(deployment, [r], Caller()) for r in requests))
        for request, got in zip(requests, answers, strict=True):
            assert_same(got.outputs[0], answer(model, request))
        count, total, ones = batch_sizes(metrics)
        pairs = sum(len(r.get("candidate_labels")) for r in requests)
        assert total == pairs  # every pair ran once, as a unit of its own
        assert count < len(requests)  # pairs of several requests shared a batch
        assert count - ones >= 1
    finally:
        await deployment.stop(1.0)


@pytest.mark.anyio
async def test_a_request_split_over_batches_is_joined_whole(
    folder: Path, model: ZeroShotModel, reference: Any
) -> None:
    # Four pairs a batch, and at most 64 tokens: ten labels take several batches.
    plane, deployment, metrics = await started(folder, max_batch_size=4, max_batch_tokens=64)
    try:
        request = item("the cat sat on the mat", candidate_labels=LABELS)
        got = (await plane.infer(deployment, [request], Caller())).outputs
        assert_same(got[0], reference("the cat sat on the mat", candidate_labels=LABELS))
        count, total, _ = batch_sizes(metrics)
        assert total == len(LABELS) and count >= 3
        tokens = metrics.registry.get_sample_value(
            "batching_batch_size_tokens_sum", {"model": "zs"}
        )
        assert tokens is not None and tokens >= sum(
            model.count_tokens(unit) for unit in model.expand(request)
        )
        # Many texts in one request (expanded off the event loop), each answered whole.
        many = [item(TEXTS[i % len(TEXTS)], candidate_labels=["cat", "dog"]) for i in range(20)]
        got = (await plane.infer(deployment, many, Caller())).outputs
        assert len(got) == 20
        for request, answered in zip(many, got, strict=True):
            assert_same(answered, reference(request.input, candidate_labels=["cat", "dog"]))
    finally:
        await deployment.stop(1.0)


@pytest.mark.anyio
async def test_bad_requests_are_refused_before_they_are_queued(folder: Path) -> None:
    plane, deployment, metrics = await started(folder, max_items_per_request=8)
    try:
        with pytest.raises(InvalidRequest, match="candidate_labels"):
            await plane.infer(deployment, ["no labels"], Caller())
        bad = TaskItem("x", (("candidate_labels", ("a",)), ("hypothesis_template", "none")))
        with pytest.raises(InvalidRequest, match="hypothesis_template"):
            await plane.infer(deployment, [bad], Caller())
        with pytest.raises(PayloadTooLarge, match="at most 8"):
            await plane.infer(deployment, [item("x", candidate_labels=LABELS)], Caller())
        assert batch_sizes(metrics)[0] == 0
    finally:
        await deployment.stop(1.0)
