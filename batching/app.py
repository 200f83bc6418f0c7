"""The app: one data plane over the models, and the doors that reach it (plain HTTP, and KServe
v2 over HTTP and gRPC), in one Starlette app whose lifespan starts and drains the models."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.control import ControlOptions, ModelControl, OnFailure, StateCollector
from batching.control import OnReady as OnInstanceReady
from batching.core.events import BatchEvents
from batching.grpc import GrpcLimits, GrpcServer
from batching.grpc.auth import ApiKeyInterceptor
from batching.grpc.control import ControlServicer
from batching.http.auth import OPEN_PATHS, ApiKeyMiddleware
from batching.http.completions import completion_routes
from batching.http.errors import EXCEPTION_HANDLERS
from batching.http.generate import generate_routes
from batching.http.limits import ConnectionLimits
from batching.http.listeners import METRICS_PATH, ListenerRoutes
from batching.http.logging_ext import logging_routes
from batching.http.middleware import RequestIdMiddleware
from batching.http.multivector import multivector_routes
from batching.http.openai import openai_routes
from batching.http.plain import plain_routes
from batching.http.redirects import RelativeRedirectMiddleware
from batching.http.repository import repository_routes
from batching.http.rerank import rerank_routes
from batching.http.sparse import sparse_routes
from batching.http.tokens import token_routes
from batching.http.v2 import v2_routes
from batching.keys import AccessKeys, ApiKeys
from batching.log_settings import LogSettings
from batching.metrics import Metrics
from batching.model_config import ModelConfig
from batching.models.default import DEFAULT_MODEL_NAME
from batching.models.protocol import Model
from batching.plane import DataPlane, Deployments
from batching.runtime.base import InstanceFactory
from batching.runtime.deployment import Deployment
from batching.runtime.warmup import InstanceInfo
from batching.tls import CertificateFiles
from batching.tracing.tracing_config import TracingConfig

__all__ = ["ModelBuilder", "create_app", "default_model_builder"]

logger = logging.getLogger("batching")

#: Request headers a browser may send cross-origin: the key, the body's type, and the headers
#: the doors read (request id, timeout, the v2 binary header length).
CORS_ALLOW_HEADERS = [
    "authorization",
    "api-key",
    "content-type",
    "x-request-id",
    "x-request-timeout-ms",
    "inference-header-content-length",
]
#: Response headers a browser's script may read.
CORS_EXPOSE_HEADERS = [
    "x-request-id",
    "retry-after",
    "www-authenticate",
    "inference-header-content-length",
]

#: Builds an unloaded model object for a model's configuration.
ModelBuilder = Callable[[ModelConfig], Model]

#: Called on the event loop when an instance of a model is loaded and warm.
OnReady = Callable[[Deployment, int, InstanceInfo], None]

#: Called on the event loop with the reason when an instance of a model cannot load.
OnLoadFailure = Callable[[Deployment, int, str], None]


def default_model_builder(config: ModelConfig) -> Model:
    """Build a model from the configuration's parsed source (see :class:`ModelSource`), told
    the configuration's engine and precision, and its default prompt override."""
    return config.model_source.build(
        config.engine_options,
        config.prompt_options,
        max_audio_seconds=config.max_audio_seconds,
        prefix_cache_mb=config.prefix_cache_mb,
    )


class _ConfigFactory:
    """A picklable zero-argument factory, so process instances can rebuild the model."""

    def __init__(self, builder: ModelBuilder, config: ModelConfig) -> None:
        self.builder = builder
        self.config = config

    def __call__(self) -> Model:
        return self.builder(self.config)


def create_app(
    models: ModelConfig | Sequence[ModelConfig] | None = None,
    *,
    builder: ModelBuilder = default_model_builder,
    instance_factory: InstanceFactory | None = None,
    max_body_bytes: int = 1 << 20,
    shutdown_timeout: float = 30.0,
    registry: CollectorRegistry | None = None,
    on_ready: OnReady | None = None,
    on_load_failure: OnLoadFailure | None = None,
    grpc_port: int | None = None,
    grpc_host: str = "127.0.0.1",
    grpc_port_explicit: bool = True,
    on_grpc_failure: Callable[[str], None] | None = None,
    on_all_ready: Callable[[], None] | None = None,
    tls: CertificateFiles | None = None,
    api_keys: ApiKeys | None = None,
    admin_keys: ApiKeys | None = None,
    cors_allow_origins: Sequence[str] = (),
    metrics_port: int | None = None,
    connection_limits: ConnectionLimits | None = None,
    model_control: ControlOptions | None = None,
    log_settings: LogSettings | None = None,
    tracing: TracingConfig | None = None,
) -> Starlette:
    """A Starlette app serving ``models`` with dynamic batching.

    :param models: one or several model configurations; None serves the default model
        (all-MiniLM-L6-v2 sentence embeddings) with default batching.
    :param builder: builds an unloaded model object from a configuration.
    :param instance_factory: how instances run (threads by default).
    :param max_body_bytes: larger request bodies get 413.
    :param shutdown_timeout: seconds the lifespan shutdown waits for accepted work.
    :param registry: the Prometheus registry to export; a fresh one by default.
    :param on_ready: called each time an instance is loaded and warm.
    :param on_load_failure: called when an instance cannot load; by default the model only
        stays unready (``/v2/repository/index`` says why).
    :param grpc_port: serve KServe v2 over gRPC on this port too (None or 0: HTTP only), once
        the models start loading; on shutdown it stops taking calls and drains them with HTTP.
        The app's ``state.grpc`` is its :class:`~batching.grpc.GrpcServer`, or None.
    :param grpc_host: the address gRPC binds.
    :param grpc_port_explicit: whether ``grpc_port`` was asked for: then a port that cannot be
        bound stops the start (``on_grpc_failure`` is told why, else the lifespan start
        fails); if it is a default, the app logs one line and serves HTTP only.
    :param on_all_ready: called once, on the event loop, the first time every model is
        loaded and warm; by default the app logs ``ready: serving ...`` then.
    :param tls: the server's certificates: gRPC serves TLS with them, and the lifespan looks
        at their files every few seconds (:mod:`batching.tls`), so that new connections on
        both doors get a renewed certificate. The HTTP listener is the host's (``server.py``
        gives uvicorn ``tls.listening_context()``).
    :param api_keys: when given, every route and RPC but the health probes and ``/metrics``
        needs one of these keys (or an admin key): :mod:`batching.http.auth`,
        :mod:`batching.grpc.auth`.
    :param admin_keys: the keys that may load and unload models (:class:`AccessKeys` says
        who may without them).
    :param cors_allow_origins: origins browsers may call from (CORS); none by default.
    :param metrics_port: the local port of a second listener the host binds for this app:
        ``/metrics`` and the probes are served there and ``/metrics`` no longer on the main
        port (:mod:`batching.http.listeners`).
    :param connection_limits: the HTTP connections' timeouts and cap (enforced by the host's
        protocol, :func:`batching.http.connections.protocol_class`), which the gRPC door
        applies to its own connections and calls, with ``max_body_bytes`` as its message
        limit (:class:`~batching.grpc.GrpcLimits`); the defaults when None.
    :param model_control: whether and how models are loaded, reloaded and unloaded at run
        time (:mod:`batching.control`); mode ``none`` when None. The app's
        ``state.control`` is its :class:`~batching.control.ModelControl`.
    :param log_settings: what ``/v2/logging`` reads and changes (the ``batching`` logger's
        level, :mod:`batching.log_settings`); by default that logger, in text format.
    :param tracing: send OpenTelemetry traces (docs/tracing.md): a server span per request
        on every door and a span per batch, linked to its requests; None: off, and
        OpenTelemetry is never imported. The app's ``state.tracing`` is its
        :class:`~batching.tracing.provider.Tracing`, or None.

    The models load in the background once the lifespan starts: ``/v2/health/live`` answers
    at once, ``/v2/health/ready`` only when every model is loaded and warm. Creating or
    serving the app changes nothing process-wide (no environment, garbage collector or
    logging settings): that is for the program that embeds it.

    Shutting down takes two steps. ``await app.state.drain(grace)`` refuses new work (infer
    503, ``/v2/health/ready`` 503, gRPC stops taking calls) and waits up to ``grace`` seconds
    for the accepted work, while the host still answers on its listener: ``python server.py``
    calls it on SIGTERM before it closes the listener. The lifespan's shutdown then stops
    the models within what is left of the grace (all of ``shutdown_timeout`` when nothing
    drained first).
    """
    if models is None:
        configs: list[ModelConfig] = [ModelConfig(name=DEFAULT_MODEL_NAME)]
    elif isinstance(models, ModelConfig):
        configs = [models]
    else:
        configs = list(models)
    if not configs:
        raise ValueError("create_app needs at least one model")
    names = [config.name for config in configs]
    if len(set(names)) != len(names):
        raise ValueError(f"model names must be unique: {names}")
    largest_batch = max(config.batching.max_batch_size for config in configs)
    metrics = Metrics(registry, max_batch_size=largest_batch)
    announced = False
    tracer = None
    if tracing is not None:
        from batching.tracing.provider import Tracing

        tracer = Tracing(tracing)

    def events_for(config: ModelConfig) -> BatchEvents:
        events: BatchEvents = metrics.for_model(config.name)
        return events if tracer is None else tracer.observe(events, config)

    def instance_ready(deployment: Deployment, index: int, info: InstanceInfo) -> None:
        nonlocal announced
        if on_ready is not None:
            on_ready(deployment, index, info)
        if announced or not deployments.ready:
            return
        announced = True
        if on_all_ready is not None:
            on_all_ready()
        else:
            logger.info("ready: serving %s", ", ".join(deployments.by_name))

    def new_deployment(
        config: ModelConfig, ready: OnInstanceReady, failed: OnFailure | None
    ) -> Deployment:
        return Deployment(
            config,
            _ConfigFactory(builder, config),
            events=events_for(config),
            instance_factory=instance_factory,
            on_ready=ready,
            on_load_failure=failed,
        )

    deployments = Deployments(
        [new_deployment(config, instance_ready, on_load_failure) for config in configs]
    )
    if tracer is not None:
        tracer.describe(deployments)
    plane = DataPlane(deployments, metrics)

    def make_deployment(
        config: ModelConfig, warm: OnInstanceReady, failed: OnFailure
    ) -> Deployment:
        """A deployment loaded at run time (:mod:`batching.control`)."""

        def loaded(deployment: Deployment, index: int, info: InstanceInfo) -> None:
            warm(deployment, index, info)
            instance_ready(deployment, index, info)

        deployment = new_deployment(config, loaded, failed)
        if tracer is not None:
            tracer.describe([deployment])
        return deployment

    keys = AccessKeys(api=api_keys, admin=admin_keys)
    control = ModelControl(
        deployments,
        model_control or ControlOptions(),
        make_deployment,
        grace=shutdown_timeout,
        started=configs,
        keys=keys,
    )
    metrics.registry.register(StateCollector(deployments))
    logs = log_settings if log_settings is not None else LogSettings()
    grpc_server = None
    if grpc_port:
        interceptors: list[object] = []
        if tracer is not None:
            from batching.grpc.tracing import TracingInterceptor

            interceptors.append(TracingInterceptor(tracer))  # first: it sees the refusals
        if api_keys is not None:
            unauthorized = metrics.unauthorized.labels("grpc")
            interceptors.append(ApiKeyInterceptor(keys, on_refused=unauthorized.inc))
        limits = connection_limits if connection_limits is not None else ConnectionLimits()
        grpc_limits = GrpcLimits(
            max_message_bytes=max_body_bytes,
            max_connections=limits.max_connections,
            handshake_timeout=limits.header_timeout,
            message_timeout=limits.body_timeout,
            idle_timeout=limits.keep_alive_timeout,
            max_metadata_bytes=limits.max_header_bytes,
        )
        grpc_server = GrpcServer(
            plane,
            grpc_host,
            grpc_port,
            limits=grpc_limits,
            explicit=grpc_port_explicit,
            on_failure=on_grpc_failure,
            tls=tls,
            interceptors=interceptors,
            servicer=lambda plane: ControlServicer(plane, control, logs),
        )

    stop_by: float | None = None

    async def drain(grace: float) -> None:
        """Refuse new work and wait up to ``grace`` seconds for the accepted work; the
        lifespan's shutdown then has what is left of ``grace`` to stop the models."""
        nonlocal stop_by
        loop = asyncio.get_running_loop()
        if stop_by is None:
            stop_by = loop.time() + grace
        if grpc_server is not None:
            grpc_server.begin_stop(grace)
        await asyncio.gather(*(deployment.drain(grace) for deployment in deployments))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for deployment in deployments:
            deployment.start()
        control.start()
        if tls is not None:
            tls.start()
        try:
            if grpc_server is not None:
                await grpc_server.start()
            yield
        finally:
            grace = shutdown_timeout
            if stop_by is not None:
                grace = max(0.0, stop_by - asyncio.get_running_loop().time())
            await control.close(grace)
            await asyncio.gather(
                *([grpc_server.stop(grace)] if grpc_server is not None else []),
                *(deployment.stop(grace) for deployment in deployments),
            )
            if tls is not None:
                await tls.stop()
            if tracer is not None:
                # Exports what is buffered, for at most a few seconds of what is left.
                left = shutdown_timeout
                if stop_by is not None:
                    left = max(0.0, stop_by - asyncio.get_running_loop().time())
                await asyncio.to_thread(tracer.shutdown, min(5.0, max(1.0, left)))

    async def live(request: Request) -> Response:
        return Response(orjson.dumps({"live": True}), media_type="application/json")

    async def ready(request: Request) -> Response:
        is_ready = deployments.ready
        return Response(
            orjson.dumps({"ready": is_ready}),
            status_code=200 if is_ready else 503,
            media_type="application/json",
        )

    async def metrics_endpoint(request: Request) -> Response:
        for deployment in deployments:
            metrics.observe_deployment(deployment)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        *plain_routes(plane, max_body_bytes),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        *v2_routes(plane, max_body_bytes),
        *openai_routes(plane, max_body_bytes),
        *completion_routes(plane, max_body_bytes),
        *generate_routes(plane, max_body_bytes),
        *rerank_routes(plane, max_body_bytes),
        *token_routes(plane, max_body_bytes),
        *multivector_routes(plane, max_body_bytes),
        *sparse_routes(plane, max_body_bytes),
        *repository_routes(control),
        *logging_routes(logs),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=EXCEPTION_HANDLERS)
    if api_keys is not None:
        # /metrics is open wherever it is served: on the main port, or (with a metrics port)
        # only on the metrics listener, whose other routes are the probes.
        unauthorized = metrics.unauthorized.labels("http")
        app.add_middleware(
            ApiKeyMiddleware,
            keys=keys,
            open_paths=OPEN_PATHS | {METRICS_PATH},
            on_refused=unauthorized.inc,
        )
    if metrics_port:
        app.add_middleware(ListenerRoutes, metrics_port=metrics_port)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(RelativeRedirectMiddleware)
    if tracer is not None:
        from batching.http.tracing import TracingMiddleware

        # Outside the key check, so that a 401 has its span too (only CORS is further out).
        app.add_middleware(TracingMiddleware, tracing=tracer)
    if cors_allow_origins:
        # Outermost: a preflight (which never carries a key) is answered here, and a 401
        # still carries the CORS headers, so a browser can read why it was refused.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_allow_origins),
            allow_methods=["GET", "POST"],
            allow_headers=CORS_ALLOW_HEADERS,
            expose_headers=CORS_EXPOSE_HEADERS,
        )
    app.state.grpc = grpc_server
    app.state.tracing = tracer
    app.state.drain = drain
    app.state.control = control
    return app
