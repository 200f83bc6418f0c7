"""Who may load and unload, and what a load may ask for, on a real server (uvicorn and gRPC on
127.0.0.1) with keys on, through tritonclient's HTTP and gRPC clients.

- A load or unload needs an admin key: an API key is refused (403, PERMISSION_DENIED), no
  key at all is refused at the door (401, UNAUTHENTICATED); the admin key is taken wherever
  an API key is. With API keys and no admin key, no one may load; with admin keys only, the
  models are open and loading is not.
- A load's config has the start-up's bounds: the operator's ``instance_group`` count of
  10,000,000 (and 100,000) is a 400 / INVALID_ARGUMENT naming the key and the bound, before
  any instance starts, and the server stays live.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from batching import ModelConfig, create_app
from batching.control import ControlOptions, RepositoryEntry
from batching.keys import ApiKeys
from batching.runtime.cpus import InstanceBudget
from batching.settings.reloads import apply_overrides
from tests.support import versions
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.slow

MODULE = "tests.support.versions"
KEY = "sk-access-user-1"
ADMIN = "sk-access-admin-1"
#: The budget of the servers here: 2 cores, so at most 8 instances in all.
BUDGET = InstanceBudget(cores=2)
#: What the clients wait for an answer at most: a refusal comes long before.
PATIENCE_S = 30


def as_user() -> dict[str, str]:
    return {"authorization": f"Bearer {KEY}"}


def as_admin() -> dict[str, str]:
    return {"authorization": f"Bearer {ADMIN}"}


def config(cls: str, version: str, name: str = "m") -> ModelConfig:
    return ModelConfig(name=name, source=f"{MODULE}:{cls}", version=version)


class Repository:
    def __init__(self, *configs: ModelConfig) -> None:
        self.models = {c.name: c for c in configs}

    def __call__(self) -> list[RepositoryEntry]:
        return [RepositoryEntry(c) for c in self.models.values()]


class Server:
    def __init__(self, url: str, grpc_target: str, repository: Repository) -> None:
        self.url = url
        self.http = url.removeprefix("http://")
        self.grpc = grpc_target
        self.repository = repository

    @contextlib.contextmanager
    def clients(self) -> Iterator[tuple[Any, Any]]:
        http = triton_http.InferenceServerClient(self.http, network_timeout=PATIENCE_S)
        grpc = triton_grpc.InferenceServerClient(self.grpc)
        try:
            yield http, grpc
        finally:
            http.close()
            grpc.close()


@contextlib.contextmanager
def server_with(**keys: Any) -> Iterator[Server]:
    versions.reset()
    repository = Repository(config("VersionOne", "1"), config("VersionTwo", "2", name="other"))
    port = free_port()
    app = create_app(
        list(repository.models.values()),
        grpc_port=port,
        model_control=ControlOptions(
            mode="explicit",
            read_repository=repository,
            apply_overrides=apply_overrides,
            instances=BUDGET,
        ),
        **keys,
    )
    with serving_in_thread(app) as url:
        yield Server(url, f"127.0.0.1:{port}", repository)


@pytest.fixture(scope="module")
def keyed() -> Iterator[Server]:
    """API keys and an admin key."""
    with server_with(
        api_keys=ApiKeys([KEY]), admin_keys=ApiKeys([ADMIN], flag="--admin-api-key")
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def _open_gates() -> Iterator[None]:
    yield
    for cls in (versions.VersionOne, versions.VersionTwo):
        if cls.load_gate is not None:
            cls.load_gate.set()


def load(client: Any, name: str, **kwargs: Any) -> None:
    if isinstance(client, triton_grpc.InferenceServerClient):
        kwargs["client_timeout"] = PATIENCE_S
    client.load_model(name, **kwargs)


def refused(call: Any, *arguments: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as raised:
        call(*arguments, **kwargs)
    return raised.value


def status_of(client: Any, http: str, grpc: str) -> str:
    return http if isinstance(client, triton_http.InferenceServerClient) else grpc


@pytest.mark.parametrize("count", [10_000_000, 100_000])
def test_the_operators_runaway_instance_count_is_refused_before_any_instance_starts(
    keyed: Server, count: int
) -> None:
    loads = versions.VersionOne.loads
    with keyed.clients() as (http, grpc), httpx.Client(base_url=keyed.url) as probe:
        for client in (http, grpc):
            error = refused(
                load,
                client,
                "m",
                config=f'{{"instance_group": [{{"count": {count}}}]}}',
                headers=as_admin(),
            )
            assert error.status() == status_of(client, "400", "StatusCode.INVALID_ARGUMENT")
            message = error.message()
            assert message.startswith("config: instance_group[0].count: "), message
            assert "at most 8 model instances in all (4 per core of a CPU budget of 2 cores)" in (
                message
            )
            assert message.endswith(f"got {count}"), message
            assert probe.get("/v2/health/live").status_code == 200
        assert versions.VersionOne.loads == loads  # no copy began to load
        index = http.get_model_repository_index(headers=as_user())
        assert [(e["name"], e["version"], e["state"]) for e in index] == [
            ("m", "1", "READY"),
            ("other", "2", "READY"),
        ]
        assert http.is_model_ready("m", headers=as_user())


def test_a_load_must_fit_beside_the_other_models_and_the_loads_under_way(keyed: Server) -> None:
    versions.VersionOne.load_gate = threading.Event()
    with keyed.clients() as (http, grpc):
        # Five copies of m loading (held at their first load) beside the one serving.
        loading = threading.Thread(
            target=load,
            args=(grpc, "m"),
            kwargs={"config": '{"instance_group": [{"count": 5}]}', "headers": as_admin()},
        )
        versions.VersionOne.began.clear()
        loading.start()
        assert versions.VersionOne.began.wait(PATIENCE_S)  # the first new copy is loading
        error = refused(
            load,
            http,
            "other",
            config='{"instance_group": [{"count": 3}]}',
            headers=as_admin(),
        )
        assert error.status() == "400"
        assert "config: instance_group[0].count: 3 instances do not fit" in error.message()
        # m's version serving (1) and the one loading (5): the version other replaces is not
        # counted, as it goes once the new one serves.
        assert "and the other models take 6" in error.message()
        assert versions.VersionOne.load_gate is not None
        versions.VersionOne.load_gate.set()
        loading.join(PATIENCE_S)
        assert not loading.is_alive()
        # Loads take turns: once m's is over, a load that fits goes through.
        load(http, "other", config='{"instance_group": [{"count": 2}]}', headers=as_admin())
        # Back to one copy each.
        load(http, "m", headers=as_admin())
        load(grpc, "other", headers=as_admin())


def test_a_load_without_a_config_must_fit_beside_the_others_too(keyed: Server) -> None:
    with keyed.clients() as (http, grpc):
        load(http, "other", config='{"instance_group": [{"count": 6}]}', headers=as_admin())
        try:
            keyed.repository.models["m"] = ModelConfig(
                name="m", source=f"{MODULE}:VersionOne", version="1", devices=("cpu",) * 3
            )
            error = refused(load, grpc, "m", headers=as_admin())
            assert error.status() == "StatusCode.INVALID_ARGUMENT"
            assert error.message() == (
                "instance_group: model 'm' asks for 3 instances: at most 8 model instances in "
                "all (4 per core of a CPU budget of 2 cores), and the other models take 6"
            )
        finally:
            keyed.repository.models["m"] = config("VersionOne", "1")
            load(http, "other", headers=as_admin())
        assert grpc.is_model_ready("m", headers=as_user())


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            '{"max_batch_size": 100000000}',
            "config: max_batch_size: must be an integer between 1 and 1024, got 100000000",
        ),
        (
            '{"queue_policy": {"max_queue_size": 100000000}}',
            "config: queue_policy.max_queue_size: "
            "must be an integer between 1 and 65536, got 100000000",
        ),
        (
            '{"queue_policy": {"max_items_per_request": 1000000}}',
            "config: queue_policy."
            "max_items_per_request: must be an integer between 1 and 65536, got 1000000",
        ),
        (
            '{"dynamic_batching": {"max_batch_tokens": 100000000}}',
            "config: dynamic_batching."
            "max_batch_tokens: must be an integer between 1 and 1048576, got 100000000",
        ),
        (
            '{"instance_group": [{"count": 4, "kind": "gpu", "gpus": [0, 1, 2]}]}',
            "config: instance_group[0].count: 12 instances do not fit",
        ),
    ],
)
def test_every_size_a_load_may_set_has_the_start_ups_bound(
    keyed: Server, overrides: str, says: str
) -> None:
    loads = versions.VersionOne.loads
    with keyed.clients() as (http, grpc):
        for client in (http, grpc):
            error = refused(load, client, "m", config=overrides, headers=as_admin())
            assert error.status() == status_of(client, "400", "StatusCode.INVALID_ARGUMENT")
            assert error.message().startswith(says), error.message()
    assert versions.VersionOne.loads == loads


def test_an_api_key_may_not_load_or_unload_and_no_key_is_refused_at_the_door(
    keyed: Server,
) -> None:
    with keyed.clients() as (http, grpc):
        for client in (http, grpc):
            for call in (client.load_model, client.unload_model):
                error = refused(call, "m", headers=as_user())
                assert error.status() == status_of(client, "403", "StatusCode.PERMISSION_DENIED")
                assert "needs an admin key (--admin-api-key)" in error.message()
                error = refused(call, "m")
                assert error.status() == status_of(client, "401", "StatusCode.UNAUTHENTICATED")
        assert http.is_model_ready("m", headers=as_user())
        # The repository's index stays readable with an API key.
        assert len(grpc.get_model_repository_index(headers=as_user()).models) == 2
    with httpx.Client(base_url=keyed.url, headers=as_user()) as client:
        answer = client.post("/v2/repository/models/m/load", json={})
    assert answer.status_code == 403
    assert answer.headers["content-type"] == "application/json"
    assert "admin key" in answer.json()["error"]


def test_the_admin_key_loads_unloads_and_passes_every_other_door(keyed: Server) -> None:
    with keyed.clients() as (http, grpc):
        grpc.unload_model("other", headers=as_admin())
        assert not http.is_model_ready("other", headers=as_admin())
        http.load_model("other", headers=as_admin())
        assert grpc.is_model_ready("other", headers=as_admin())
        assert http.get_model_metadata("m", headers=as_admin())["versions"] == ["1"]


def test_with_api_keys_and_no_admin_key_no_one_may_load() -> None:
    with server_with(api_keys=ApiKeys([KEY])) as running, running.clients() as (http, grpc):
        for client in (http, grpc):
            error = refused(client.load_model, "m", headers=as_user())
            assert error.status() == status_of(client, "403", "StatusCode.PERMISSION_DENIED")
            assert "this server has none: start it with --admin-api-key" in error.message()
            assert refused(client.load_model, "m", headers=as_admin()).status() == status_of(
                client, "401", "StatusCode.UNAUTHENTICATED"
            )


def test_with_admin_keys_only_the_models_are_open_and_loading_is_not() -> None:
    admin = ApiKeys([ADMIN], flag="--admin-api-key")
    with server_with(admin_keys=admin) as running, running.clients() as (http, grpc):
        assert http.is_model_ready("m") and grpc.is_model_ready("m")
        for client in (http, grpc):
            error = refused(client.load_model, "m")
            assert error.status() == status_of(client, "403", "StatusCode.PERMISSION_DENIED")
            assert "this request presents no key" in error.message()
            error = refused(client.unload_model, "m", headers=as_user())
            assert "presents a key that is not one" in error.message()
        http.load_model("m", headers=as_admin())
        grpc.load_model("m", headers=as_admin())
