"""A task's request parameters on every door: the plain body's ``parameters`` (or keys beside
``inputs``), KServe v2 ``parameters`` over HTTP (tritonclient.http) and over gRPC
(tritonclient.grpc), with the model repository's defaults. What reaches the model's queue is
seen exactly: a recording model answers each item with its input and parameters. An unknown
key or a wrong type is a 400 (INVALID_ARGUMENT) naming the key; a bad default stops start-up."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from batching import ModelConfig, create_app
from batching.models.parameters import PARAMETERS_KEY, TaskItem
from batching.models.tasks.text import TOKEN_CLASSIFICATION
from batching.settings.repository import RepositoryError, load_repository
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread
from tests.support.tiny import encoder_folder

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """Declares token-classification's parameters; answers each item with what it received."""

    def load(self, device: str) -> None:
        pass

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        return [json.dumps(_seen(item)) for item in inputs]

    def warmup_inputs(self, max_batch_size: int) -> list[list[Any]]:
        return [["warm"]]

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "output", "datatype": "BYTES", "shape": [-1]}],
            PARAMETERS_KEY: {param.name: param.describe() for param in TOKEN_CLASSIFICATION},
        }


def _seen(item: Any) -> dict[str, Any]:
    if isinstance(item, TaskItem):
        return {"input": item.input, "parameters": dict(item.parameters)}
    return {"input": item, "plain": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    folder = str(encoder_folder(tmp_path_factory.mktemp("tagger")))
    configs = [
        ModelConfig(name="bare", source=folder, task="token-classification"),
        ModelConfig(
            name="tagged",
            source=folder,
            task="token-classification",
            parameters=(("ignore_labels", ("O", "MISC")),),
        ),
    ]
    port = free_port()
    app = create_app(configs, builder=lambda _: Recorder(), grpc_port=port)
    with serving_in_thread(app) as url:
        yield url, f"127.0.0.1:{port}"


def rows(result: Any) -> list[dict[str, Any]]:
    """The JSON rows of a tritonclient result's ``output``."""
    return [json.loads(row) for row in result.as_numpy("output").ravel()]


def answers(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    return [json.loads(output) for output in response.json()["outputs"]]


def test_plain_parameters_reach_the_queue_checked_with_the_defaults(
    server: tuple[str, str],
) -> None:
    url, _ = server
    with httpx.Client(base_url=url) as client:
        plain = client.post("/models/bare", json={"inputs": ["a", "b"]})
        assert answers(plain) == [{"input": "a", "plain": True}, {"input": "b", "plain": True}]
        body = {"inputs": "a", "parameters": {"aggregation_strategy": "simple"}}
        assert answers(client.post("/models/bare", json=body)) == [
            {"input": "a", "parameters": {"aggregation_strategy": "simple"}}
        ]
        # Defaults apply to every request; a request's own value wins over them.
        assert answers(client.post("/models/tagged", content=b"a"))[0]["parameters"] == {
            "ignore_labels": ["O", "MISC"]
        }
        body = {"inputs": ["a"], "ignore_labels": "B-PER", "aggregation_strategy": "max"}
        assert answers(client.post("/models/tagged", json=body))[0]["parameters"] == {
            "aggregation_strategy": "max",
            "ignore_labels": ["B-PER"],
        }


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"inputs": "a", "parameters": {"top_k": 2}}, "'top_k'"),
        ({"inputs": "a", "options": {"x": 1}}, "'options'"),
        ({"inputs": "a", "parameters": {"aggregation_strategy": 1}}, "'aggregation_strategy'"),
        ({"inputs": "a", "parameters": {"aggregation_strategy": "most"}}, "'aggregation_strategy'"),
        ({"inputs": "a", "parameters": {"ignore_labels": [1]}}, "'ignore_labels'"),
        ({"inputs": "a", "parameters": {"ignore_labels": []}}, "'ignore_labels'"),
    ],
)
def test_a_plain_unknown_key_or_wrong_type_is_a_400_naming_it(
    server: tuple[str, str], body: dict[str, Any], named: str
) -> None:
    url, _ = server
    for model in ("bare", "tagged"):
        answer = httpx.post(f"{url}/models/{model}", json=body)
        assert answer.status_code == 400, answer.text
        assert named in answer.json()["error"]


def test_tritonclient_http_sends_task_parameters_beside_tritons_own(
    server: tuple[str, str],
) -> None:
    url, _ = server
    client = triton_http.InferenceServerClient(url.removeprefix("http://"))
    text = triton_http.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array(["a", "b"], dtype=object))
    result = client.infer(
        "tagged",
        [text],
        parameters={"aggregation_strategy": "first"},
        priority=1,
        timeout=5_000_000,
    )
    assert rows(result) == [
        {
            "input": x,
            "parameters": {"aggregation_strategy": "first", "ignore_labels": ["O", "MISC"]},
        }
        for x in ("a", "b")
    ]
    # A list parameter as JSON, or as a string holding a JSON array (as gRPC must send it).
    for labels in (["B-LOC", "O"], '["B-LOC", "O"]'):
        result = client.infer("bare", [text], parameters={"ignore_labels": labels})
        assert rows(result)[0]["parameters"] == {"ignore_labels": ["B-LOC", "O"]}
    for parameters, named in (
        ({"top_k": 1}, "'top_k'"),
        ({"aggregation_strategy": True}, "'aggregation_strategy'"),
        ({"ignore_labels": "[1, 2]"}, "'ignore_labels'"),
    ):
        with pytest.raises(InferenceServerException) as caught:
            client.infer("bare", [text], parameters=parameters)
        assert caught.value.status() == "400"
        assert named in str(caught.value.message())
    client.close()


def test_tritonclient_grpc_sends_task_parameters(server: tuple[str, str]) -> None:
    _, target = server
    client = triton_grpc.InferenceServerClient(target)
    text = triton_grpc.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([["a"]], dtype=object))
    result = client.infer(
        "bare",
        [text],
        parameters={"aggregation_strategy": "average", "ignore_labels": '["O", "I-PER"]'},
        client_timeout=10,
    )
    assert rows(result) == [
        {
            "input": "a",
            "parameters": {"aggregation_strategy": "average", "ignore_labels": ["O", "I-PER"]},
        }
    ]
    result = client.infer("tagged", [text])
    assert rows(result)[0]["parameters"] == {"ignore_labels": ["O", "MISC"]}
    for parameters, named in (
        ({"stride": 4}, "'stride'"),
        ({"aggregation_strategy": 3}, "'aggregation_strategy'"),
        ({"aggregation_strategy": "mean"}, "'aggregation_strategy'"),
    ):
        with pytest.raises(InferenceServerException) as caught:
            client.infer("tagged", [text], parameters=parameters)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert named in str(caught.value.message())
    client.close()


def test_an_output_parameter_a_task_does_not_take_is_a_400(server: tuple[str, str]) -> None:
    url, _ = server
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
        "outputs": [{"name": "output", "parameters": {"encoding": "int8"}}],
    }
    answer = httpx.post(f"{url}/v2/models/bare/infer", json=body)
    assert answer.status_code == 400 and "'encoding'" in answer.json()["error"]


# --- server-wide defaults: the model repository's parameters table -----------------------------


def _repository(tmp_path: Path, table: str) -> Path:
    folder = encoder_folder(tmp_path)
    file = tmp_path / "models.toml"
    file.write_text(
        f'[models.tagger]\nsource = "{folder}"\ntask = "token-classification"\n'
        f"[models.tagger.parameters]\n{table}"
    )
    return file


def test_repository_defaults_are_read_and_checked(tmp_path: Path) -> None:
    file = _repository(tmp_path, 'aggregation_strategy = "simple"\nignore_labels = ["O"]\n')
    (model,) = load_repository(file)
    assert model.parameters == (("aggregation_strategy", "simple"), ("ignore_labels", ("O",)))
    for table, named in (
        ("top_k = 2\n", "'top_k'"),
        ("aggregation_strategy = 1\n", "'aggregation_strategy'"),
        ('aggregation_strategy = "most"\n', "'aggregation_strategy'"),
    ):
        with pytest.raises(RepositoryError, match=named):
            load_repository(_repository(tmp_path / named.strip("'"), table))
    with pytest.raises(ValueError, match="declares none"):
        ModelConfig(name="default", parameters=(("top_k", 1),))


def test_a_bad_default_stops_the_server_with_one_line(tmp_path: Path) -> None:
    file = _repository(tmp_path, "top_k = 2\n")
    done = subprocess.run(
        [sys.executable, str(ROOT / "server.py"), "--model-repository", str(file)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown parameter 'top_k'" in lines[0], done.stderr
