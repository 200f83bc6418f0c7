"""Triton's model configuration and statistics extensions over HTTP: the shapes Triton's
clients (tritonclient, perf_analyzer) read, checked against Triton's own protobuf messages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_aio
from google.protobuf.json_format import ParseDict
from tritonclient.grpc import model_config_pb2, service_pb2

from batching import BatchingConfig, ModelConfig, create_app
from batching.kserve import describe
from batching.runtime.deployment import Deployment
from tests.support.asgi import app_with, echo_config, serving
from tests.support.models import EchoModel, GatedModel, VectorModel
from tests.support.servers import running

pytestmark = pytest.mark.anyio

VECTORS = ModelConfig(
    name="vectors",
    source="tests.support.models:VectorModel",
    devices=("cpu", "cpu"),
    batching=BatchingConfig(
        max_batch_size=8,
        preferred_batch_sizes=(4, 8),
        max_queue_delay=0.003,
        timeout=5.0,
        max_queue_size=100,
        policy="adaptive",
    ),
)
MODELS = [
    VECTORS,
    ModelConfig(name="echo", source="tests.support.models:EchoModel", version="3"),
    ModelConfig(name="sum", source="tests.support.models:SumModel"),
]

#: Each model's metadata shapes and configuration dims, as Triton gives them for a batching
#: model: the metadata's first dimension is the batch, the dims are per item.
EXPECTED_TENSORS = {
    "vectors": (
        [("text", "BYTES", [-1, 1], "TYPE_STRING", [1])],
        [("embedding", "FP32", [-1, 4], "TYPE_FP32", [4])],
    ),
    "echo": (
        [("text", "BYTES", [-1, 1], "TYPE_STRING", [1])],
        [("echo", "BYTES", [-1, 1], "TYPE_STRING", [1])],
    ),
    "sum": (
        [("values", "FP32", [-1, 3], "TYPE_FP32", [3])],
        [("total", "FP32", [-1, 1], "TYPE_FP32", [1])],
    ),
}

LEAVES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@pytest.fixture
async def server_url() -> AsyncIterator[str]:
    async with running(create_app(MODELS)) as url:
        yield url


def strict_model_config(config: dict[str, Any]) -> model_config_pb2.ModelConfig:
    """``config`` parsed into Triton's ``ModelConfig`` message, refusing any key that is not a
    field of it and any value not of the field's type."""
    return ParseDict(config, model_config_pb2.ModelConfig(), ignore_unknown_fields=False)


def assert_leaf(leaf: Any) -> None:
    assert set(leaf) == {"count", "ns"}
    assert all(type(value) is int and value >= 0 for value in leaf.values())


def assert_triton_statistics(document: dict[str, Any]) -> None:
    """Every field perf_analyzer reads, with its type; and Triton's message takes it."""
    ParseDict(document, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=False)
    for model in document["model_stats"]:
        assert isinstance(model["name"], str) and isinstance(model["version"], str)
        for key in ("last_inference", "inference_count", "execution_count"):
            assert type(model[key]) is int
        stats = model["inference_stats"]
        assert set(stats) == {*LEAVES, "cache_hit", "cache_miss"}
        for leaf in stats.values():
            assert_leaf(leaf)
        for entry in model["batch_stats"]:
            assert type(entry["batch_size"]) is int
            for key in ("compute_input", "compute_infer", "compute_output"):
                assert_leaf(entry[key])


async def test_the_config_is_a_triton_model_config(server_url: str) -> None:
    async with httpx.AsyncClient(base_url=server_url) as client:
        config = (await client.get("/v2/models/vectors/config")).json()
        versioned = (await client.get("/v2/models/vectors/versions/1/config")).json()
    assert versioned == config
    strict_model_config(config)
    assert config["name"] == "vectors"
    assert config["max_batch_size"] == 8
    assert config["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}]
    assert config["output"] == [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [4]}]
    assert config["dynamic_batching"] == {
        "preferred_batch_size": [4, 8],
        "max_queue_delay_microseconds": 3000,
        "preserve_ordering": False,
        "default_queue_policy": {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": 5_000_000,
            "allow_timeout_override": True,
            "max_queue_size": 100,
        },
    }
    assert config["instance_group"] == [
        {"name": "vectors_0", "count": 2, "kind": "KIND_CPU", "gpus": []}
    ]
    # VectorModel is a class of the user's own: platform python.
    assert (config["platform"], config["backend"]) == ("python", "batching")
    assert config["version_policy"] == {"specific": {"versions": [1]}}
    assert config["model_transaction_policy"] == {"decoupled": False}
    parameters = config["parameters"]
    assert parameters["policy"] == {"string_value": "adaptive"}
    assert parameters["max_latency_microseconds"] == {"string_value": "100000"}
    assert parameters["devices"] == {"string_value": "cpu,cpu"}
    assert "max_batch_tokens" not in parameters  # not set: left out, not "None"


def test_instance_groups_and_versions_in_tritons_terms() -> None:
    config = ModelConfig(
        name="m",
        devices=("cuda:0", "cuda:0", "cuda:1", "cuda", "cpu", "mps"),
        version="v2",
        batching=BatchingConfig(max_batch_tokens=4096),
    )
    deployment = Deployment(config, EchoModel)  # never started: its metadata is empty
    described = describe.model_config(deployment)
    strict_model_config(described)
    assert described["instance_group"] == [
        {"name": "m_0", "count": 2, "kind": "KIND_GPU", "gpus": [0]},
        {"name": "m_1", "count": 1, "kind": "KIND_GPU", "gpus": [1]},
        {"name": "m_2", "count": 1, "kind": "KIND_GPU", "gpus": [0]},
        {"name": "m_3", "count": 1, "kind": "KIND_CPU", "gpus": []},
        {"name": "m_4", "count": 1, "kind": "KIND_MODEL", "gpus": []},
    ]
    assert described["version_policy"] == {"latest": {"num_versions": 1}}
    assert described["parameters"]["version"] == {"string_value": "v2"}
    assert described["parameters"]["max_batch_tokens"] == {"string_value": "4096"}
    assert (described["input"], described["output"]) == ([], [])


def test_an_optional_input_is_optional_in_the_config() -> None:
    deployment = Deployment(ModelConfig(name="pairs"), EchoModel)
    deployment.metadata = {
        "inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [-1]},
            {"name": "text_pair", "datatype": "BYTES", "shape": [-1], "optional": True},
        ],
        "outputs": [{"name": "score", "datatype": "FP32", "shape": [-1, 1]}],
    }
    described = describe.model_config(deployment)
    strict_model_config(described)
    assert described["input"] == [
        {"name": "text", "data_type": "TYPE_STRING", "dims": [1]},
        {"name": "text_pair", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    ]
    assert [t["shape"] for t in describe.model_metadata(deployment)["inputs"]] == [[-1, 1]] * 2


@pytest.mark.parametrize(
    ("shape", "dims"),
    [([-1], [1]), ([], [1]), (None, [1]), ([-1, 384], [384]), ([384], [384]), ([-1, -1], [-1])],
)
def test_item_dims_drop_the_batch_and_spell_a_scalar_as_one(
    shape: list[int] | None, dims: list[int]
) -> None:
    assert describe.item_dims(shape) == dims


def test_data_types_as_triton_spells_them() -> None:
    assert describe.triton_data_type("BYTES") == "TYPE_STRING"
    assert describe.triton_data_type("FP32") == "TYPE_FP32"
    for datatype in ("BOOL", "UINT8", "INT64", "FP16", "FP64", "BF16"):
        assert model_config_pb2.DataType.Value(describe.triton_data_type(datatype))


async def test_metadata_and_config_agree_as_tritons_do(server_url: str) -> None:
    client = triton_aio.InferenceServerClient(server_url.removeprefix("http://"))
    try:
        for name, (inputs, outputs) in EXPECTED_TENSORS.items():
            metadata = await client.get_model_metadata(name)
            config = await client.get_model_config(name)
            for kind, expected in (("inputs", inputs), ("outputs", outputs)):
                described = metadata[kind]
                configured = config[kind.removesuffix("s")]
                assert [(t["name"], t["datatype"], t["shape"]) for t in described] == [
                    (n, datatype, shape) for n, datatype, shape, _, _ in expected
                ]
                assert [(t["name"], t["data_type"], t["dims"]) for t in configured] == [
                    (n, data_type, dims) for n, _, _, data_type, dims in expected
                ]
                for tensor, entry in zip(described, configured, strict=True):
                    assert tensor["shape"] == [-1, *entry["dims"]]
    finally:
        await client.close()


@pytest.mark.parametrize("shape", [[3], [3, 1]])
async def test_text_requests_of_shape_n_and_n_by_1_both_work(
    server_url: str, shape: list[int]
) -> None:
    texts = ["a", "bb", "ccc"]
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape, "data": texts}]}
    async with httpx.AsyncClient(base_url=server_url) as client:
        response = await client.post("/v2/models/vectors/infer", json=body)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["shape"] == [3, 4]
    assert output["data"][::4] == [1.0, 2.0, 3.0]


async def test_statistics_count_requests_batches_and_their_time(server_url: str) -> None:
    client = triton_aio.InferenceServerClient(server_url.removeprefix("http://"))
    try:
        before = await client.get_inference_statistics("vectors")
        assert_triton_statistics(before)
        (zero,) = before["model_stats"]
        assert zero["inference_count"] == 0 and zero["last_inference"] == 0
        tensor = triton_aio.InferInput("text", [3, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([["x"], ["yy"], ["zzz"]], dtype=object))
        started_ms = time.time() * 1000
        for _ in range(4):
            await client.infer("vectors", [tensor])
        after = await client.get_inference_statistics("vectors", model_version="1")
        everything = await client.get_inference_statistics()
    finally:
        await client.close()
    assert_triton_statistics(after)
    assert_triton_statistics(everything)
    assert {model["name"] for model in everything["model_stats"]} == {"vectors", "echo", "sum"}
    (stats,) = after["model_stats"]
    assert (stats["name"], stats["version"]) == ("vectors", "1")
    assert stats["inference_count"] == 12
    assert stats["execution_count"] == 4
    assert started_ms - 1000 <= stats["last_inference"] <= time.time() * 1000 + 1000
    inference = stats["inference_stats"]
    for key in LEAVES:
        expected = 0 if key == "fail" else 4
        assert inference[key]["count"] == expected, key
    assert inference["success"]["ns"] > 0
    assert inference["compute_infer"]["ns"] > 0
    # The parts of a request's time add up to no more than the whole.
    assert inference["queue"]["ns"] + inference["compute_infer"]["ns"] <= inference["success"]["ns"]
    (batches,) = stats["batch_stats"]
    assert batches["batch_size"] == 3
    assert batches["compute_infer"]["count"] == 4
    assert batches["compute_infer"]["ns"] == inference["compute_infer"]["ns"]


async def test_a_request_behind_a_busy_model_counts_its_queue_time() -> None:
    model = GatedModel()
    async with serving(app_with(model, echo_config(max_queue_delay=0.0))) as client:
        holder = asyncio.ensure_future(client.post("/", content=b"holds the instance"))
        await asyncio.to_thread(model.entered.wait, 10)
        waiter = asyncio.ensure_future(client.post("/", content=b"waits"))
        # Admission expects 100 items/s before it has measured any: 100 ms is time enough.
        late = asyncio.ensure_future(
            client.post("/", content=b"gives up", headers={"x-request-timeout-ms": "100"})
        )
        for _ in range(1000):
            metrics = (await client.get("/metrics")).text
            if 'batching_queue_depth_items{model="echo"} 2.0' in metrics:
                break
            await asyncio.sleep(0.005)
        assert (await late).status_code == 504
        await asyncio.sleep(0.05)  # the time measured: the waiter queues at least this long
        model.gate.set()
        assert (await holder).status_code == 200
        assert (await waiter).status_code == 200
        document = (await client.get("/v2/models/echo/stats")).json()
        everything = (await client.get("/v2/models/stats")).json()
    assert_triton_statistics(document)
    assert everything == document  # one model served
    inference = document["model_stats"][0]["inference_stats"]
    assert inference["success"]["count"] == 2
    assert inference["queue"]["count"] == 2
    assert inference["queue"]["ns"] >= 50_000_000  # the waiter's
    assert inference["compute_infer"]["ns"] >= 50_000_000  # the holder's, gated that long
    # The request that timed out in the queue is a failure, seen when its turn came.
    assert inference["fail"]["count"] == 1
    assert inference["fail"]["ns"] >= 100_000_000


async def test_refusals_count_as_failures() -> None:
    model = GatedModel()
    async with serving(app_with(model, echo_config(max_items_per_request=2))) as client:
        model.gate.set()
        refused = await client.post("/", json={"inputs": ["a", "b", "c"]})
        document = (await client.get("/v2/models/echo/stats")).json()
    assert refused.status_code == 413
    inference = document["model_stats"][0]["inference_stats"]
    assert inference["fail"] == {"count": 1, "ns": 0}
    assert inference["success"]["count"] == 0


async def test_statistics_are_listed_and_unknown_models_are_404(server_url: str) -> None:
    async with httpx.AsyncClient(base_url=server_url) as client:
        server = (await client.get("/v2")).json()
        missing = await client.get("/v2/models/nope/stats")
        wrong_version = await client.get("/v2/models/echo/versions/1/stats")
        versioned = await client.get("/v2/models/echo/versions/3/stats")
    assert {"statistics", "model_configuration"} <= set(server["extensions"])
    assert missing.status_code == 404 and "error" in missing.json()
    assert wrong_version.status_code == 404
    assert versioned.json()["model_stats"][0]["version"] == "3"


def _sync_client_reads_config_and_statistics(url: str) -> None:
    client = triton_http.InferenceServerClient(url.removeprefix("http://"))
    try:
        config = client.get_model_config("echo", model_version="3")
        strict_model_config(config)
        assert config["max_batch_size"] == 32
        stats = client.get_inference_statistics("echo")
        assert_triton_statistics(stats)
    finally:
        client.close()


async def test_tritonclient_sync_reads_config_and_statistics(server_url: str) -> None:
    await asyncio.to_thread(_sync_client_reads_config_and_statistics, server_url)


def test_statistics_of_a_deployment_observed_by_something_else_are_zero() -> None:
    deployment = Deployment(ModelConfig(name="quiet"), VectorModel)  # NoEvents
    stats = describe.model_statistics(deployment)
    assert_triton_statistics({"model_stats": [stats]})
    assert stats["inference_stats"]["success"] == {"count": 0, "ns": 0}
    assert stats["batch_stats"] == []
