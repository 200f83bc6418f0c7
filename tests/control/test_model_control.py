"""Model control in-process: load, reload and unload calls (Triton's model repository
extension) in each mode, the swap's guarantees with gated versions, the states the index,
readiness, metadata and ``/metrics`` show, and what an unload gives back.

Every call runs in a task of its own, as each request does in a real server (uvicorn's request
cycle, a gRPC call): a request holds the deployment it resolved until it is answered.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import orjson
import psutil
import pytest
from prometheus_client import CollectorRegistry

from batching import ModelConfig, create_app
from batching.control import ControlOptions, RepositoryEntry
from batching.keys import ApiKeys
from batching.runtime.collector import release_unloaded_objects
from batching.settings.reloads import apply_overrides
from tests.support import versions
from tests.support.asgi import serving
from tests.support.metrics import sample

pytestmark = pytest.mark.anyio

MODULE = "tests.support.versions"


def config(cls: str, version: str, name: str = "m") -> ModelConfig:
    return ModelConfig(name=name, source=f"{MODULE}:{cls}", version=version)


@pytest.fixture(autouse=True)
def _reset_versions() -> Iterator[None]:
    versions.reset()
    yield
    for cls in (versions.VersionOne, versions.VersionTwo, versions.HeavyModel):
        for gate in (cls.load_gate, cls.predict_gate):
            if gate is not None:
                gate.set()
    versions.reset()


class Repository:
    """What the repository holds, changed by the test."""

    def __init__(self, *configs: ModelConfig) -> None:
        self.models = {c.name: c for c in configs}

    def __call__(self) -> list[RepositoryEntry]:
        return [RepositoryEntry(c) for c in self.models.values()]


def app_for(
    repository: Repository, mode: str = "explicit", **kwargs: Any
) -> tuple[Any, CollectorRegistry]:
    registry = CollectorRegistry()
    options = ControlOptions(
        mode=mode,
        read_repository=repository,
        apply_overrides=apply_overrides,
        on_released=kwargs.pop("on_released", None),
    )
    app = create_app(
        list(repository.models.values()), model_control=options, registry=registry, **kwargs
    )
    return app, registry


async def call(client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One request in a task of its own."""
    return await asyncio.create_task(client.request(method, url, **kwargs))


def infer_body(*texts: str) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}
        ]
    }


async def infer(client: httpx.AsyncClient, *texts: str, model: str = "m") -> dict[str, Any]:
    answer = await call(client, "POST", f"/v2/models/{model}/infer", json=infer_body(*texts))
    assert answer.status_code == 200, answer.text
    document: dict[str, Any] = answer.json()
    return document


def versions_of(answer: dict[str, Any]) -> set[str]:
    return {value.split(":")[0] for value in answer["outputs"][0]["data"]}


async def index(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    answer = await call(client, "POST", "/v2/repository/index", json={})
    assert answer.status_code == 200
    entries: list[dict[str, Any]] = answer.json()
    return entries


def states(entries: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(e["name"], e["version"], e["state"]) for e in entries}


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    for _ in range(3000):
        if await check():
            return
        await asyncio.sleep(0.01)  # polling what a client would poll: the index, a probe
    raise AssertionError("never happened")


@pytest.fixture
async def explicit() -> AsyncIterator[tuple[httpx.AsyncClient, Repository, CollectorRegistry]]:
    repository = Repository(config("VersionOne", "1"))
    app, registry = app_for(repository)
    async with serving(app) as client:
        yield client, repository, registry


@pytest.mark.parametrize("mode", ["none", "poll"])
async def test_load_and_unload_answer_400_naming_the_mode_unless_explicit(mode: str) -> None:
    app, _ = app_for(Repository(config("VersionOne", "1")), mode=mode)
    async with serving(app) as client:
        for action in ("load", "unload"):
            answer = await call(client, "POST", f"/v2/repository/models/m/{action}")
            assert answer.status_code == 400
            assert f"model control mode is {mode}" in answer.json()["error"]
        assert versions_of(await infer(client, "a")) == {"1"}


async def test_reload_swaps_versions_and_the_old_one_finishes_what_it_accepted(
    explicit: tuple[httpx.AsyncClient, Repository, CollectorRegistry],
) -> None:
    client, repository, registry = explicit
    versions.VersionOne.predict_gate = gate_one = threading.Event()
    running = asyncio.create_task(client.post("/v2/models/m/infer", json=infer_body("x", "y")))
    await asyncio.to_thread(versions.VersionOne.entered.wait, 30)

    versions.VersionTwo.load_gate = gate_two = threading.Event()
    repository.models["m"] = config("VersionTwo", "2")
    loading = asyncio.create_task(client.post("/v2/repository/models/m/load"))

    async def version_two_loading() -> bool:
        return ("m", "2", "LOADING") in states(await index(client))

    await until(version_two_loading)
    # Loading beside the served version: the server and the model stay ready, version 1
    # described and counted as READY.
    assert ("m", "1", "READY") in states(await index(client))
    assert (await call(client, "GET", "/v2/health/ready")).status_code == 200
    assert (await call(client, "GET", "/v2/models/m/ready")).status_code == 200
    assert (await call(client, "GET", "/v2/models/m")).json()["versions"] == ["1"]
    metrics = (await call(client, "GET", "/metrics")).text
    assert sample(metrics, "batching_model_state", model="m", version="2", state="LOADING") == 1
    assert sample(metrics, "batching_model_state", model="m", version="1", state="READY") == 1

    gate_two.set()
    answer = await loading
    assert answer.status_code == 200, answer.text
    # New requests go to version 2 at once; the one running on version 1 is still there.
    assert versions_of(await infer(client, "new")) == {"2"}
    assert (await call(client, "GET", "/v2/models/m")).json()["versions"] == ["2"]
    assert ("m", "1", "UNLOADING") in states(await index(client))
    assert not running.done()
    gate_one.set()
    old = (await running).json()
    assert old["model_version"] == "1"
    assert old["outputs"][0]["data"] == ["1:x", "1:y"]

    async def retired() -> bool:
        return states(await index(client)) == {("m", "2", "READY")}

    await until(retired)
    # The retired version's copy is unloaded (its hook runs on its instance's thread once the
    # version is stopped), the serving one's is not.
    assert await asyncio.to_thread(versions.VersionOne.unloaded.wait, 10)
    assert (versions.VersionOne.unloads, versions.VersionTwo.unloads) == (1, 0)
    metrics = (await call(client, "GET", "/metrics")).text
    assert sample(metrics, "batching_model_state", 0.0, model="m", version="1", state="READY") == 0
    assert sample(metrics, "batching_model_state", model="m", version="2", state="READY") == 1

    # And back: rolling back is a load of the previous configuration.
    repository.models["m"] = config("VersionOne", "1")
    assert (await call(client, "POST", "/v2/repository/models/m/load")).status_code == 200
    assert versions_of(await infer(client, "back")) == {"1"}


async def test_a_load_that_fails_keeps_the_old_version_and_answers_the_error(
    explicit: tuple[httpx.AsyncClient, Repository, CollectorRegistry],
) -> None:
    client, repository, _ = explicit
    repository.models["m"] = config("BrokenVersion", "3")
    answer = await call(client, "POST", "/v2/repository/models/m/load")
    assert answer.status_code == 500
    error = answer.json()["error"]
    assert "failed to load (OSError" in error and "version 1 keeps serving" in error
    assert "/srv" not in answer.text and "Traceback" not in answer.text
    assert versions_of(await infer(client, "still")) == {"1"}
    assert (await call(client, "GET", "/v2/health/ready")).status_code == 200
    entries = await index(client)
    assert ("m", "1", "READY") in states(entries)
    failed = next(e for e in entries if e["version"] == "3")
    assert failed["state"] == "UNAVAILABLE" and "OSError" in failed["reason"]


async def test_load_errors_are_4xx_with_json(
    explicit: tuple[httpx.AsyncClient, Repository, CollectorRegistry],
) -> None:
    client, _, _ = explicit
    unknown = await call(client, "POST", "/v2/repository/models/nope/load")
    assert unknown.status_code == 404 and "no model named 'nope'" in unknown.json()["error"]
    for body, expected in [
        (b"[1]", "JSON object"),
        (b"{", "not valid JSON"),
        (orjson.dumps({"parameters": {"file:1/model.onnx": "AAAA"}}), "no model files"),
        (orjson.dumps({"parameters": {"other": 1}}), "not a parameter of a load call"),
        (orjson.dumps({"parameters": {"config": '{"source": "/etc"}'}}), "config: source"),
        (orjson.dumps({"parameters": {"config": '{"max_batch_size": -1}'}}), "max_batch_size"),
        (orjson.dumps({"parameters": {"config": "[]"}}), "must be a JSON object"),
    ]:
        answer = await call(client, "POST", "/v2/repository/models/m/load", content=body)
        assert answer.status_code == 400, (body, answer.text)
        assert expected in answer.json()["error"], answer.text
    assert versions_of(await infer(client, "a")) == {"1"}
    gone = await call(client, "POST", "/v2/repository/models/nope/unload")
    assert gone.status_code == 404
    bad = await call(
        client, "POST", "/v2/repository/models/m/unload", json={"parameters": {"x": True}}
    )
    assert bad.status_code == 400


async def test_a_load_config_overrides_the_repository_file(
    explicit: tuple[httpx.AsyncClient, Repository, CollectorRegistry],
) -> None:
    client, _, _ = explicit
    overrides = {
        "max_batch_size": 3,
        "version": "7",
        "dynamic_batching": {"max_queue_delay_ms": 0.5},
    }
    answer = await call(
        client,
        "POST",
        "/v2/repository/models/m/load",
        json={"parameters": {"config": orjson.dumps(overrides).decode()}},
    )
    assert answer.status_code == 200, answer.text
    described = (await call(client, "GET", "/v2/models/m/config")).json()
    assert described["max_batch_size"] == 3
    assert (await infer(client, "a"))["model_version"] == "7"


async def test_unload_serves_what_it_accepted_then_404s_and_shows_unavailable(
    explicit: tuple[httpx.AsyncClient, Repository, CollectorRegistry],
) -> None:
    client, _, registry = explicit
    versions.VersionOne.predict_gate = gate = threading.Event()
    running = asyncio.create_task(client.post("/v2/models/m/infer", json=infer_body("x")))
    await asyncio.to_thread(versions.VersionOne.entered.wait, 30)
    unloading = asyncio.create_task(client.post("/v2/repository/models/m/unload"))

    async def shows_unloading() -> bool:
        return ("m", "1", "UNLOADING") in states(await index(client))

    await until(shows_unloading)
    assert (
        await call(client, "POST", "/v2/models/m/infer", json=infer_body("late"))
    ).status_code == 404
    assert (await call(client, "GET", "/v2/models/m/ready")).status_code == 404
    assert not unloading.done()
    gate.set()
    assert (await running).json()["outputs"][0]["data"] == ["1:x"]
    assert (await unloading).status_code == 200
    assert await asyncio.to_thread(versions.VersionOne.unloaded.wait, 10)  # its hook ran
    assert versions.VersionOne.unloads == 1
    entries = await index(client)
    assert states(entries) == {("m", "1", "UNAVAILABLE")}
    unnamed = await call(client, "POST", "/", content=b"no model left")
    assert unnamed.status_code == 404 and unnamed.json() == {"error": "no model is loaded"}
    assert (await call(client, "GET", "/v2/health/ready")).status_code == 200
    assert entries[0]["reason"] == "unloaded"
    metrics = (await call(client, "GET", "/metrics")).text
    assert sample(metrics, "batching_model_state", model="m", version="1", state="UNAVAILABLE") == 1
    # Loaded again, it serves again.
    assert (await call(client, "POST", "/v2/repository/models/m/load")).status_code == 200
    assert versions_of(await infer(client, "again")) == {"1"}
    assert states(await index(client)) == {("m", "1", "READY")}


async def test_unload_gives_the_memory_back() -> None:
    process = psutil.Process()
    repository = Repository(config("VersionOne", "1"), config("HeavyModel", "1", name="heavy"))
    heavy = repository.models.pop("heavy")
    app, _ = app_for(repository, on_released=release_unloaded_objects)
    async with serving(app) as client:
        gc.collect()
        before = process.memory_info().rss
        repository.models["heavy"] = heavy
        assert (await call(client, "POST", "/v2/repository/models/heavy/load")).status_code == 200
        assert versions_of(await infer(client, "a", model="heavy")) == {"heavy"}
        loaded = process.memory_info().rss
        assert loaded > before + versions.HEAVY_BYTES * 0.9  # the test can fail
        assert (await call(client, "POST", "/v2/repository/models/heavy/unload")).status_code == 200
        after = process.memory_info().rss
        assert after <= before * 1.10, (before, loaded, after)


async def test_the_routes_need_a_key_when_keys_are_set() -> None:
    app, _ = app_for(Repository(config("VersionOne", "1")), api_keys=ApiKeys(["sk-control-1"]))
    async with serving(app, wait_ready=False) as client:
        for method, path in [
            ("POST", "/v2/repository/models/m/load"),
            ("POST", "/v2/repository/models/m/unload"),
            ("GET", "/v2/logging"),
            ("POST", "/v2/logging"),
        ]:
            answer = await call(client, method, path, json={})
            assert answer.status_code == 401, path
        keyed = {"authorization": "Bearer sk-control-1"}
        assert (await call(client, "GET", "/v2/logging", headers=keyed)).status_code == 200


async def test_a_request_that_resolved_the_old_version_before_the_swap_is_served_by_it(
    explicit: tuple[httpx.AsyncClient, Repository, CollectorRegistry],
) -> None:
    client, repository, _ = explicit
    body_sent = asyncio.Event()
    resolved = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        resolved.set()  # the door resolved the model before it reads the body
        await body_sent.wait()
        yield orjson.dumps(infer_body("held"))

    held = asyncio.create_task(client.post("/v2/models/m/infer", content=slow_body()))
    await resolved.wait()
    repository.models["m"] = config("VersionTwo", "2")
    assert (await call(client, "POST", "/v2/repository/models/m/load")).status_code == 200
    assert versions_of(await infer(client, "new")) == {"2"}
    assert ("m", "1", "UNLOADING") in states(await index(client))  # it waits for the request
    body_sent.set()
    answer = await held
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == ["1:held"]


async def test_shutdown_stops_a_replaced_version_that_is_still_finishing() -> None:
    repository = Repository(config("VersionOne", "1"))
    app, _ = app_for(repository, shutdown_timeout=0.2)
    versions.VersionOne.predict_gate = threading.Event()  # never opened: the batch hangs
    async with serving(app) as client:
        held = asyncio.create_task(client.post("/v2/models/m/infer", json=infer_body("x")))
        await asyncio.to_thread(versions.VersionOne.entered.wait, 30)
        repository.models["m"] = config("VersionTwo", "2")
        assert (await call(client, "POST", "/v2/repository/models/m/load")).status_code == 200
        assert ("m", "1", "UNLOADING") in states(await index(client))
    # The shutdown's grace passed: the request the old version could not finish is answered.
    answer = await asyncio.wait_for(held, 10)
    assert answer.status_code == 503


async def test_without_a_repository_a_load_reloads_the_model_of_the_flags() -> None:
    app = create_app(
        config("VersionOne", "1"),
        model_control=ControlOptions(mode="explicit", apply_overrides=apply_overrides),
        registry=CollectorRegistry(),
    )
    async with serving(app) as client:
        reload = await call(
            client,
            "POST",
            "/v2/repository/models/m/load",
            json={"parameters": {"config": {"version": "9"}}},
        )
        assert reload.status_code == 200, reload.text
        assert (await infer(client, "a"))["model_version"] == "9"
        assert (await call(client, "POST", "/v2/repository/models/other/load")).status_code == 404
        assert (await call(client, "POST", "/v2/repository/models/m/load")).status_code == 200
        assert (await infer(client, "a"))["model_version"] == "1"
