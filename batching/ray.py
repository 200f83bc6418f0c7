"""Ray Serve: the same HTTP routes through Ray's proxy, each replica the full batching service.

``pip install -e ".[ray]"``, then::

    serve run batching.ray:build_app replicas=2
    serve run batching.ray:build_app model=path/or/module:Class max_batch_size=64 replicas=3
    serve run batching.ray:build_app autoscaling=true min_replicas=1 max_replicas=4

Every ``key=value`` that is not one of Ray's options below is a ``server.py`` flag
(``max_batch_size=64`` is ``--max-batch-size 64``). Ray's options:

- ``replicas``: how many replicas (default 1), when not autoscaling;
- ``autoscaling=true`` with ``min_replicas`` (1), ``max_replicas`` (4) and
  ``target_ongoing_requests``: the requests each replica should hold, queued and running
  (default: two full batches' worth of one-item requests, ``2 x max_batch_size``);
- ``num_cpus``: CPUs Ray reserves per replica (default 1); torch's threads follow it;
- ``max_ongoing_requests``: what Ray lets into one replica at once (default: the model's
  ``max_queue_size``, so that batches fill and the replica's own admission answers 503).

gRPC is not served through Ray (Ray's gRPC proxy needs its own protos); use HTTP.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ray import serve
from ray.serve import Application
from starlette.applications import Starlette

from batching.app import create_app
from batching.runtime.collector import settle_loaded_objects
from batching.runtime.deployment import Deployment
from batching.runtime.warmup import InstanceInfo
from batching.settings.cli import ServerSettings, parse_settings

__all__ = ["RAY_OPTIONS", "build_app", "server_argv"]

#: The ``key=value`` arguments Ray's deployment takes; every other key is a server flag.
RAY_OPTIONS = frozenset(
    {
        "replicas",
        "autoscaling",
        "min_replicas",
        "max_replicas",
        "target_ongoing_requests",
        "num_cpus",
        "max_ongoing_requests",
        "ready_timeout_s",
    }
)

#: Flags that make no sense behind Ray's proxy: it binds the port, and gRPC stays off.
_IGNORED = frozenset({"host", "port", "grpc_port"})


def server_argv(args: dict[str, str]) -> list[str]:
    """The ``server.py`` flags among ``args``: ``max_batch_size=8`` -> ``--max-batch-size 8``."""
    argv: list[str] = []
    for key, value in args.items():
        name = key.lstrip("-").replace("-", "_")
        if name in RAY_OPTIONS or name in _IGNORED:
            continue
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def _settings(argv: list[str]) -> ServerSettings:
    try:
        return parse_settings(argv)
    except SystemExit as exc:  # argparse has printed why
        raise ValueError(f"invalid batching options {argv}: see the message above") from exc


def _true(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"autoscaling must be true or false, not {value!r}")


class _Loading:
    """One replica's models as they load: ready once every model is, failed if one cannot."""

    def __init__(self, models: int) -> None:
        self.models = models
        self.loaded: dict[str, Deployment] = {}
        self.failure: str | None = None

    def on_ready(self, deployment: Deployment, index: int, info: InstanceInfo) -> None:
        self.loaded[deployment.name] = deployment
        settle_loaded_objects()  # as server.py does (see batching.runtime.collector)

    def on_load_failure(self, deployment: Deployment, index: int, reason: str) -> None:
        self.failure = f"model {deployment.name!r} cannot be loaded: {reason}"

    @property
    def ready(self) -> bool:
        return len(self.loaded) == self.models and all(d.ready for d in self.loaded.values())


def _app_builder(argv: list[str]) -> Any:
    """The builder ``serve.ingress`` evaluates on each replica: the full batching app."""

    def build_replica_app() -> Starlette:
        # The replica's process is its own: set what server.py sets, before torch loads.
        for variable, value in (
            ("HF_HUB_OFFLINE", "1"),
            ("TRANSFORMERS_OFFLINE", "1"),
            ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
        ):
            os.environ.setdefault(variable, value)
        settings = _settings(argv)
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(settings.torch_threads)
        loading = _Loading(len(settings.models))
        app = create_app(
            settings.models,
            max_body_bytes=settings.max_body_bytes,
            shutdown_timeout=settings.shutdown_timeout,
            on_ready=loading.on_ready,
            on_load_failure=loading.on_load_failure,
            grpc_port=None,
            # Each replica asks for the keys itself (the file is re-read on change, per
            # replica); CORS as on server.py.
            api_keys=settings.api_keys,
            admin_keys=settings.admin_keys,
            cors_allow_origins=settings.cors_allow_origins,
        )
        app.state.batching_loading = loading
        return app

    return build_replica_app


def build_app(args: dict[str, str]) -> Application:
    """Ray Serve's application builder: ``serve run batching.ray:build_app key=value ...``."""
    argv = server_argv(args)
    settings = _settings(argv)  # a bad flag fails here, on the driver, not in every replica
    if settings.metrics_port is not None:
        raise ValueError(
            "metrics_port does not apply under Ray Serve: Ray's proxy owns the listener "
            "(scrape Ray's metrics, or each replica's /metrics through it)"
        )
    largest = max(model.batching.max_batch_size for model in settings.models)
    queue = max(model.batching.max_queue_size for model in settings.models)
    ready_timeout = float(args.get("ready_timeout_s", "600"))

    class BatchingReplica:
        def __init__(self) -> None:
            self._started = False

        async def check_health(self) -> None:
            """Ray's first check holds the replica out of routing until every model is
            loaded and warm; later checks fail only if a model cannot load at all."""
            app: Starlette = self.app  # type: ignore[attr-defined]
            loading: _Loading = app.state.batching_loading
            if loading.failure is not None:
                raise RuntimeError(loading.failure)
            if self._started:
                return
            loop = asyncio.get_running_loop()
            deadline = loop.time() + ready_timeout
            while not loading.ready:
                if loading.failure is not None:
                    raise RuntimeError(loading.failure)
                if loop.time() > deadline:
                    raise RuntimeError(f"the models were not ready within {ready_timeout:g} s")
                await asyncio.sleep(0.05)
            self._started = True

    ingress = serve.ingress(_app_builder(argv))(BatchingReplica)
    options: dict[str, Any] = {
        "name": "batching",
        "max_ongoing_requests": int(args.get("max_ongoing_requests", str(queue))),
        "ray_actor_options": {"num_cpus": float(args.get("num_cpus", "1"))},
        # The first health check waits for load and warm-up.
        "health_check_timeout_s": max(30.0, ready_timeout),
    }
    if _true(args.get("autoscaling", "false")):
        options["autoscaling_config"] = {
            "min_replicas": int(args.get("min_replicas", "1")),
            "max_replicas": int(args.get("max_replicas", "4")),
            "target_ongoing_requests": float(args.get("target_ongoing_requests", str(2 * largest))),
        }
    else:
        options["num_replicas"] = int(args.get("replicas", "1"))
    deployment = serve.deployment(**options)(ingress)
    return deployment.bind()
