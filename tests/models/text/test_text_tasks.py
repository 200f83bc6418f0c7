"""The text tasks' parameters, applied: text-classification (``top_k``,
``function_to_apply``), token-classification (``aggregation_strategy``, ``ignore_labels``),
fill-mask (``top_k``, ``targets``) and feature-extraction, on tiny models built from a config.

Single answers equal ``transformers.pipeline(...)`` called directly with the same parameters
(within 1e-4, torch fp32); 16 concurrent requests with mixed parameters equal their single
answers and run in batches over 1 (``/metrics``); bad input is a 4xx with a JSON body through
the plain door, KServe v2 over HTTP and over gRPC."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import transformers
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.metrics import sample
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread
from tests.support.tiny import classifier_folder, encoder_folder, masked_folder
from tests.support.tiny_tasks import token_classifier_folder

ROOT = Path(__file__).resolve().parents[3]
TEXTS = ["the cat sat on the mat", "a dog runs fast", "i like it", "the red house is good"]
MASKED = ["the [MASK] sat on the mat", "a dog [MASK] fast", "i [MASK] it", "the red [MASK]"]

#: (served model, task, folder maker, inputs, parameters of each case); {} is none.
CASES: dict[str, tuple[str, Any, list[str], list[dict[str, Any]]]] = {
    "classify": (
        "text-classification",
        lambda root: classifier_folder(root, "classify", ["neg", "neu", "pos"]),
        TEXTS,
        [
            {},
            {"top_k": 2},
            {"function_to_apply": "sigmoid"},
            {"top_k": 3, "function_to_apply": "none"},
        ],
    ),
    "tagger": (
        "token-classification",
        token_classifier_folder,
        TEXTS,
        [
            {},
            {"aggregation_strategy": "simple"},
            {"aggregation_strategy": "first", "ignore_labels": ["O", "B-PER"]},
            {"ignore_labels": ["B-LOC"]},
        ],
    ),
    "mlm": (
        "fill-mask",
        masked_folder,
        MASKED,
        [{}, {"top_k": 2}, {"targets": ["cat", "dog", "fish"]}, {"targets": "house", "top_k": 1}],
    ),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("text-tasks")
    made = {name: make(root) for name, (_, make, _, _) in CASES.items()}
    made["embed"] = encoder_folder(root)
    return made


@pytest.fixture(scope="module")
def server(folders: dict[str, Path]) -> Iterator[tuple[str, str]]:
    tasks = {name: task for name, (task, _, _, _) in CASES.items()}
    tasks["embed"] = "feature-extraction"
    batching = BatchingConfig(max_batch_size=16, max_queue_delay=0.05)
    configs = [
        ModelConfig(
            name=name,
            source=str(folders[name]),
            task=task,
            engine="torch",
            precision="fp32",
            batching=batching,
        )
        for name, task in tasks.items()
    ]
    port = free_port()
    with serving_in_thread(create_app(configs, grpc_port=port)) as url:
        yield url, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def direct(folders: dict[str, Path]) -> dict[str, Any]:
    """Each model's own transformers pipeline, called directly."""
    return {
        name: transformers.pipeline(task, model=str(folders[name]), device="cpu")
        for name, (task, _, _, _) in CASES.items()
    }


def plain(value: Any) -> Any:
    """A pipeline's answer as JSON (numpy scalars become numbers)."""
    return json.loads(json.dumps(value, default=lambda v: v.tolist()))


def assert_close(ours: Any, theirs: Any, where: str = "answer") -> None:
    if isinstance(theirs, float) or isinstance(ours, float):
        assert abs(ours - theirs) <= 1e-4, f"{where}: {ours} != {theirs}"
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and set(ours) == set(theirs), f"{where}: {ours} != {theirs}"
        for key in theirs:
            assert_close(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), f"{where}: {ours} != {theirs}"
        for index, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
            assert_close(mine, other, f"{where}[{index}]")
    else:
        assert ours == theirs, f"{where}: {ours} != {theirs}"


def expected(pipe: Any, name: str, text: str, parameters: dict[str, Any]) -> Any:
    """What the pipeline answers for one text, as the server answers one input."""
    answer = plain(pipe(text, **parameters))
    if name == "classify" and "top_k" not in parameters:
        return answer[0]  # the pipeline wraps a lone text's best label in a list
    return answer


def ask(client: httpx.Client, name: str, text: str, parameters: dict[str, Any]) -> Any:
    body: dict[str, Any] = {"inputs": [text]}
    if parameters:
        body["parameters"] = parameters
    answer = client.post(f"/models/{name}", json=body)
    assert answer.status_code == 200, answer.text
    (output,) = answer.json()["outputs"]
    return output


@pytest.mark.parametrize("name", list(CASES))
def test_single_answers_equal_the_pipeline_called_directly(
    server: tuple[str, str], direct: dict[str, Any], name: str
) -> None:
    url, _ = server
    _, _, texts, cases = CASES[name]
    with httpx.Client(base_url=url, timeout=30) as client:
        for parameters in cases:
            for text in texts:
                want = expected(direct[name], name, text, parameters)
                assert_close(ask(client, name, text, parameters), want, f"{name} {parameters}")


def test_feature_extraction_equals_the_model_mean_pooled(
    server: tuple[str, str], folders: dict[str, Path]
) -> None:
    url, _ = server
    pipe = transformers.pipeline("feature-extraction", model=str(folders["embed"]), device="cpu")
    with httpx.Client(base_url=url, timeout=30) as client:
        for text in TEXTS:
            (vector,) = client.post("/models/embed", json={"inputs": [text]}).json()["outputs"]
            want = np.asarray(pipe(text, return_tensors=True))[0].mean(axis=0)
            np.testing.assert_allclose(vector, want, atol=1e-4)
        # Its options are the embedding options; a task parameter is refused.
        answer = client.post("/models/embed", json={"inputs": ["a"], "parameters": {"top_k": 1}})
        assert answer.status_code == 400 and "'top_k'" in answer.json()["error"]


@pytest.mark.parametrize("name", list(CASES))
def test_sixteen_concurrent_requests_equal_their_single_answers_in_batches_over_one(
    server: tuple[str, str], name: str
) -> None:
    url, _ = server
    _, _, texts, cases = CASES[name]
    asked = [(texts[i % len(texts)], cases[(i // len(texts)) % len(cases)]) for i in range(16)]
    with httpx.Client(base_url=url, timeout=30) as client:
        singles = [ask(client, name, text, parameters) for text, parameters in asked]
        before = client.get("/metrics").text
        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(lambda job: ask(client, name, *job), asked))
        after = client.get("/metrics").text
    for single, answer, job in zip(singles, together, asked, strict=True):
        assert_close(answer, single, f"{name} {job}")
    metric = "batching_batch_size_items"
    batches = sample(after, f"{metric}_count", model=name) - sample(
        before, f"{metric}_count", model=name
    )
    items = sample(after, f"{metric}_sum", model=name) - sample(before, f"{metric}_sum", model=name)
    assert items == 16 and batches < 16, (items, batches)


BAD = [
    ("classify", {"top_k": 0}, "'top_k'"),
    ("classify", {"function_to_apply": "tanh"}, "'function_to_apply'"),
    ("tagger", {"aggregation_strategy": "longest"}, "'aggregation_strategy'"),
    ("mlm", {"targets": [1, 2]}, "'targets'"),
    ("mlm", {"top_k": "3"}, "'top_k'"),
    ("mlm", {"candidate_labels": ["a"]}, "'candidate_labels'"),
]


@pytest.mark.parametrize(("name", "parameters", "named"), BAD)
def test_bad_parameters_are_a_400_with_a_json_body_on_every_door(
    server: tuple[str, str], name: str, parameters: dict[str, Any], named: str
) -> None:
    url, target = server
    text = CASES[name][2][0]
    answer = httpx.post(f"{url}/models/{name}", json={"inputs": [text], "parameters": parameters})
    assert answer.status_code == 400 and named in answer.json()["error"]
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}],
        "parameters": parameters,
    }
    answer = httpx.post(f"{url}/v2/models/{name}/infer", json=body)
    assert answer.status_code == 400 and named in answer.json()["error"]
    scalars = {
        key: json.dumps(value) if isinstance(value, list) else value
        for key, value in parameters.items()
    }
    client = triton_grpc.InferenceServerClient(target)
    tensor = triton_grpc.InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text], dtype=object))
    with pytest.raises(InferenceServerException) as caught:
        client.infer(name, [tensor], parameters=scalars)
    client.close()
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert named in str(caught.value.message())


def test_bad_input_is_a_4xx_with_a_json_body_on_every_door(server: tuple[str, str]) -> None:
    url, target = server
    # A target the tokenizer makes nothing of: the pipeline refuses it, the server says so.
    answer = httpx.post(
        f"{url}/models/mlm", json={"inputs": [MASKED[0]], "parameters": {"targets": [" "]}}
    )
    assert answer.status_code == 422 and "'targets'" in answer.json()["error"]
    answer = httpx.post(
        f"{url}/models/mlm", json={"inputs": [MASKED[0]], "parameters": {"top_k": 10_000}}
    )
    assert answer.status_code == 422 and "'top_k'" in answer.json()["error"]
    answer = httpx.post(f"{url}/models/tagger", json={"inputs": [{"text": 1}]})
    assert answer.status_code == 422 and "inputs[0]" in answer.json()["error"]
    body = {"inputs": [{"name": "text", "datatype": "INT64", "shape": [1], "data": [1]}]}
    answer = httpx.post(f"{url}/v2/models/classify/infer", json=body)
    assert answer.status_code == 422 and "BYTES" in answer.json()["error"]
    client = triton_grpc.InferenceServerClient(target)
    tensor = triton_grpc.InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([MASKED[0]], dtype=object))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("mlm", [tensor], parameters={"targets": '[" "]'})
    client.close()
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'targets'" in str(caught.value.message())


# --- the README's examples ---------------------------------------------------------------------

#: The README's model folders, and the models here that stand for them.
README_MODELS = {
    "my-tagger": "tagger",
    "my-classifier": "classify",
    "my-bert": "mlm",
    "my-encoder": "embed",
}


def readme_examples() -> list[tuple[str, dict[str, Any]]]:
    """Each ``curl -s 127.0.0.1:8000/models/my-...`` of docs/tasks.md: the folder and the body."""
    found = []
    for line in (ROOT / "docs" / "tasks.md").read_text().splitlines():
        if line.startswith("curl -s 127.0.0.1:8000/models/my-"):
            words = shlex.split(line)
            folder = words[2].rpartition("/")[2]
            found.append((folder, json.loads(words[words.index("-d") + 1])))
    return found


def test_the_readme_examples_answer_as_the_pipeline_does(
    server: tuple[str, str], direct: dict[str, Any]
) -> None:
    url, _ = server
    examples = readme_examples()
    assert {folder for folder, _ in examples} == set(README_MODELS)
    with httpx.Client(base_url=url, timeout=30) as client:
        for folder, body in examples:
            name = README_MODELS[folder]
            answer = client.post(f"/models/{name}", json=body)
            assert answer.status_code == 200, (folder, answer.text)
            if name in direct:
                (text,) = body["inputs"]
                want = expected(direct[name], name, text, body.get("parameters", {}))
                assert_close(answer.json()["outputs"][0], want, folder)


def test_the_v2_metadata_lists_each_task_s_parameters(server: tuple[str, str]) -> None:
    url, _ = server
    tagger = httpx.get(f"{url}/v2/models/tagger").json()
    assert set(tagger["parameters"]) == {"aggregation_strategy", "ignore_labels"}
    assert tagger["parameters"]["aggregation_strategy"]["choices"][0] == "none"
    assert httpx.get(f"{url}/v2/models/mlm").json()["parameters"]["top_k"]["batch_neutral"]
    assert "parameters" not in httpx.get(f"{url}/v2/models/embed").json()


def test_items_whose_parameters_change_the_forward_pass_run_apart(folders: dict[str, Path]) -> None:
    from batching.models.parameters import TaskItem
    from batching.models.text.pipeline import PipelineModel

    model = PipelineModel("text-classification", folders["classify"])
    model.load("cpu")
    items = [TaskItem(TEXTS[0], (("top_k", 2),)), TEXTS[1], TaskItem(TEXTS[2], (("top_k", 2),))]
    shared = model.predict(items)
    runs: list[list[Any]] = []
    run = model._run

    def counted(group: list[Any], key: dict[str, Any]) -> list[Any]:
        runs.append(group)
        return run(group, key)

    model._run = counted  # type: ignore[method-assign]
    assert model.predict(items) == shared and len(runs) == 1  # top_k is batch-neutral
    runs.clear()
    model._neutral = frozenset()  # as if top_k changed the forward pass
    assert model.predict(items) == shared
    assert sorted(len(group) for group in runs) == [1, 2]


def test_a_refused_parameter_value_never_fails_the_requests_batched_with_it(
    server: tuple[str, str],
) -> None:
    url, _ = server
    bodies = [{"inputs": [text], "parameters": {"top_k": 2}} for text in MASKED * 2]
    bodies.append({"inputs": [MASKED[0]], "parameters": {"targets": [" "]}})
    with httpx.Client(base_url=url, timeout=30) as client, ThreadPoolExecutor(9) as pool:
        answers = list(pool.map(lambda body: client.post("/models/mlm", json=body), bodies))
    assert [answer.status_code for answer in answers] == [200] * 8 + [422]
    assert all(len(answer.json()["outputs"][0]) == 2 for answer in answers[:8])
