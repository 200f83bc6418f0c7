"""Model control and the logging extension on a real server (uvicorn and gRPC on 127.0.0.1),
with tritonclient's HTTP and gRPC clients: a reload while 32 clients send requests loses none
and mixes no versions; load, unload and the repository index over both doors; keys; the log
level at run time.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from batching import ModelConfig, create_app
from batching.control import ControlOptions, RepositoryEntry
from batching.keys import ApiKeys
from batching.settings.reloads import apply_overrides
from tests.support import versions
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread

MODULE = "tests.support.versions"
KEY = "sk-control-server-1"
CLIENTS = 32


def config(cls: str, version: str, name: str = "m") -> ModelConfig:
    return ModelConfig(name=name, source=f"{MODULE}:{cls}", version=version)


class Repository:
    def __init__(self, *configs: ModelConfig) -> None:
        self.models = {c.name: c for c in configs}

    def __call__(self) -> list[RepositoryEntry]:
        return [RepositoryEntry(c) for c in self.models.values()]


class Server:
    def __init__(self, url: str, grpc_target: str, repository: Repository) -> None:
        self.http = url.removeprefix("http://")
        self.grpc = grpc_target
        self.repository = repository


@contextlib.contextmanager
def server_with(mode: str = "explicit", **kwargs: Any) -> Iterator[Server]:
    versions.reset()
    repository = Repository(config("VersionOne", "1"))
    port = free_port()
    app = create_app(
        list(repository.models.values()),
        grpc_port=port,
        model_control=ControlOptions(
            mode=mode, read_repository=repository, apply_overrides=apply_overrides
        ),
        **kwargs,
    )
    with serving_in_thread(app) as url:
        yield Server(url, f"127.0.0.1:{port}", repository)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with server_with() as running:
        yield running


@pytest.fixture(autouse=True)
def _back_to_version_one(server: Server) -> Iterator[None]:
    yield
    versions.reset()
    server.repository.models = {"m": config("VersionOne", "1")}
    with clients(server) as (http, _):
        http.load_model("m")


@contextlib.contextmanager
def clients(
    server: Server,
) -> Iterator[tuple[triton_http.InferenceServerClient, triton_grpc.InferenceServerClient]]:
    http = triton_http.InferenceServerClient(server.http)
    grpc = triton_grpc.InferenceServerClient(server.grpc)
    try:
        yield http, grpc
    finally:
        http.close()
        grpc.close()


def infer_texts(client: triton_http.InferenceServerClient, texts: list[str]) -> Any:
    tensor = triton_http.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object))
    return client.infer("m", [tensor])


class Load:
    """``CLIENTS`` threads, half with a tritonclient HTTP client and half with a gRPC one,
    sending requests of four texts until stopped; what came back, and whether a request mixed
    versions."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.done = threading.Condition()
        self.answers = 0
        self.by_version: dict[str, int] = {}
        self.mixed: list[Any] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._client, args=(index,), daemon=True)
            for index in range(CLIENTS)
        ]

    def _client(self, index: int) -> None:
        client: Any
        if index % 2:
            client = triton_grpc.InferenceServerClient(self.server.grpc)
            module: Any = triton_grpc
        else:
            client = triton_http.InferenceServerClient(self.server.http, network_timeout=60)
            module = triton_http
        with contextlib.closing(client):
            self._send(index, client, module)

    def _send(self, index: int, client: Any, module: Any) -> None:
        sent = 0
        while not self.stop.is_set():
            texts = [f"c{index}-r{sent}-{item}" for item in range(4)]
            sent += 1
            try:
                tensor = module.InferInput("text", [len(texts)], "BYTES")
                tensor.set_data_from_numpy(np.array(texts, dtype=object))
                result = client.infer("m", [tensor])
                outputs = [value.decode() for value in result.as_numpy("version").reshape(-1)]
                response = result.get_response()
                said = (
                    response["model_version"] if module is triton_http else response.model_version
                )
            except Exception as exc:
                with self.done:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    self.done.notify_all()
                continue
            seen = {value.split(":")[0] for value in outputs}
            with self.done:
                if seen != {said} or [v.split(":", 1)[1] for v in outputs] != texts:
                    self.mixed.append((said, outputs))
                self.by_version[said] = self.by_version.get(said, 0) + 1
                self.answers += 1
                self.done.notify_all()

    def wait_for(self, version: str, more: int) -> None:
        """Until ``more`` answers of ``version`` came back (from now)."""
        with self.done:
            target = self.by_version.get(version, 0) + more
            assert self.done.wait_for(
                lambda: self.by_version.get(version, 0) >= target or bool(self.errors),
                timeout=60,
            ), "no answers"
            assert not self.errors, self.errors[:3]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


def test_a_reload_under_32_clients_loses_no_request_and_mixes_no_versions(
    server: Server,
) -> None:
    with clients(server) as (http, grpc), Load(server) as load:
        load.wait_for("1", 64)
        server.repository.models["m"] = config("VersionTwo", "2")
        http.load_model("m")
        load.wait_for("2", 64)
        server.repository.models["m"] = config("VersionOne", "1")
        grpc.load_model("m")  # and back, over gRPC
        load.wait_for("1", 64)
    assert load.errors == []
    assert load.mixed == []
    assert load.by_version["1"] >= 128 and load.by_version["2"] >= 64


def test_unload_and_load_over_both_doors_with_the_index_on_each(server: Server) -> None:
    with clients(server) as (http, grpc):
        unload_and_load(server, http, grpc)


def unload_and_load(
    server: Server,
    http: triton_http.InferenceServerClient,
    grpc: triton_grpc.InferenceServerClient,
) -> None:
    (ready,) = http.get_model_repository_index()
    assert (ready["name"], ready["version"], ready["state"]) == ("m", "1", "READY")
    assert ready["memory_mb"] >= 0  # what its load added
    grpc.unload_model("m")
    assert not http.is_model_ready("m")
    assert not grpc.is_model_ready("m")
    assert http.is_server_ready()  # no model left unready: the ones served are all ready
    for entries in (
        http.get_model_repository_index(),
        grpc.get_model_repository_index(as_json=True)["models"],
    ):
        assert entries == [
            {"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        ]
    with pytest.raises(InferenceServerException, match="no model named 'm' is served"):
        infer_texts(http, ["gone"])
    with pytest.raises(InferenceServerException, match="is not loaded"):
        http.unload_model("m")
    server.repository.models["m"] = config("VersionTwo", "2")
    http.load_model("m", config='{"version": "5"}')
    assert http.is_model_ready("m", "5")
    assert grpc.get_model_metadata("m", as_json=True)["versions"] == ["5"]
    assert infer_texts(http, ["back"]).as_numpy("version").reshape(-1)[0] == b"2:back"


def test_a_failing_load_answers_the_error_over_grpc(server: Server) -> None:
    with clients(server) as (_, grpc):
        failing_load(server, grpc)


def failing_load(server: Server, grpc: triton_grpc.InferenceServerClient) -> None:
    server.repository.models["m"] = config("BrokenVersion", "3")
    with pytest.raises(InferenceServerException) as raised:
        grpc.load_model("m")
    assert "failed to load (OSError" in str(raised.value)
    assert "/srv" not in str(raised.value)
    with pytest.raises(InferenceServerException, match="file:"):
        grpc.load_model("m", files={"file:1/model.onnx": b"weights"})
    assert grpc.is_model_ready("m", "1")


@pytest.fixture
def batching_level() -> Iterator[logging.Logger]:
    logger = logging.getLogger("batching")
    level = logger.level
    logger.setLevel(logging.INFO)
    yield logger
    logger.setLevel(level)


def test_log_level_at_run_time_over_both_doors(
    server: Server, batching_level: logging.Logger
) -> None:
    with clients(server) as (http, grpc):
        log_level(http, grpc, batching_level)


def log_level(
    http: triton_http.InferenceServerClient,
    grpc: triton_grpc.InferenceServerClient,
    batching_level: logging.Logger,
) -> None:
    settings = http.get_log_settings()
    assert settings["log_info"] is True and settings["log_verbose_level"] == 0
    now = http.update_log_settings({"log_verbose_level": 1})
    assert now["log_level"] == "debug"
    assert batching_level.isEnabledFor(logging.DEBUG)
    got = grpc.get_log_settings(as_json=True)["settings"]
    assert got["log_verbose_level"] == {"uint32_param": 1}
    grpc.update_log_settings({"log_verbose_level": 0, "log_info": False})
    assert batching_level.getEffectiveLevel() == logging.WARNING
    assert http.get_log_settings()["log_level"] == "warning"
    for refused in ({"log_file": "/tmp/x.log"}, {"log_level": "loud"}, {"verbose": 1}):
        with pytest.raises(InferenceServerException):
            http.update_log_settings(refused)
    with pytest.raises(InferenceServerException, match="log_file"):
        grpc.update_log_settings({"log_file": "/tmp/x.log"})
    assert batching_level.getEffectiveLevel() == logging.WARNING


def test_model_control_and_log_rpcs_need_a_key_and_the_mode() -> None:
    with (
        server_with(mode="none", api_keys=ApiKeys([KEY])) as running,
        clients(running) as (
            http,
            grpc,
        ),
    ):
        keyed = {"authorization": f"Bearer {KEY}"}
        for client in (grpc, http):
            calls: dict[str, tuple[Any, ...]] = {
                "load_model": ("m",),
                "unload_model": ("m",),
                "get_log_settings": (),
                "update_log_settings": ({"log_info": True},),
            }
            for call, arguments in calls.items():
                with pytest.raises(InferenceServerException) as raised:
                    getattr(client, call)(*arguments)
                assert "API key is required" in str(raised.value)
        for client in (grpc, http):
            with pytest.raises(InferenceServerException, match="model control mode is none"):
                client.load_model("m", headers=keyed)
            with pytest.raises(InferenceServerException, match="model control mode is none"):
                client.unload_model("m", headers=keyed)
        assert http.is_model_ready("m", headers=keyed)
        assert grpc.get_log_settings(headers=keyed, as_json=True)["settings"]["log_file"] == {
            "string_param": ""
        }
