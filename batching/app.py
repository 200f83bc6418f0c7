"""The HTTP edge: routes, the lifespan that starts and drains the models, and the one place
where errors become status codes."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .config import ModelConfig
from .deployment import Deployment, InstanceFactory
from .errors import (
    BatchingError,
    DeadlineExceeded,
    InferenceFailed,
    InvalidRequest,
    ModelNotFound,
    PayloadTooLarge,
    Unavailable,
    UnprocessableInput,
)
from .metrics import Metrics
from .model import DEFAULT_MODEL_NAME, Model, build_model
from .plain import check_texts, encode_outputs, parse_inputs
from .v2 import v2_routes

__all__ = ["ModelBuilder", "create_app", "default_model_builder"]

logger = logging.getLogger("batching")

STATUS_FOR: dict[type[BatchingError], int] = {
    InvalidRequest: 400,
    ModelNotFound: 404,
    PayloadTooLarge: 413,
    UnprocessableInput: 422,
    InferenceFailed: 500,
    Unavailable: 503,
    DeadlineExceeded: 504,
}

#: Builds an unloaded model object for a model's configuration.
ModelBuilder = Callable[[ModelConfig], Model]

_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")
TIMEOUT_HEADER = "x-request-timeout-ms"


def default_model_builder(config: ModelConfig) -> Model:
    """Build a model from ``config.source`` and ``config.task`` (see :func:`build_model`)."""
    return build_model(config.source, config.task)


class _ConfigFactory:
    """A picklable zero-argument factory, so process instances can rebuild the model."""

    def __init__(self, builder: ModelBuilder, config: ModelConfig) -> None:
        self.builder = builder
        self.config = config

    def __call__(self) -> Model:
        return self.builder(self.config)


class _Models:
    """The deployments this app serves, by name; the first is the default."""

    def __init__(self, deployments: Sequence[Deployment]) -> None:
        self.by_name = {deployment.name: deployment for deployment in deployments}
        self.default = deployments[0]

    def get(self, name: str, version: str | None = None) -> Deployment:
        deployment = self.by_name.get(name)
        if deployment is None:
            raise ModelNotFound(f"no model named {name!r} is served")
        if version is not None and version != deployment.config.version:
            raise ModelNotFound(f"model {name!r} has no version {version!r}")
        return deployment


def _error_response(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps({"error": message}),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _status_of(exc: BatchingError) -> int:
    for cls in type(exc).__mro__:
        status = STATUS_FOR.get(cls)  # type: ignore[arg-type]
        if status is not None:
            return status
    return 500


async def _batching_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BatchingError)
    status = _status_of(exc)
    headers = None
    if isinstance(exc, Unavailable):
        headers = {"Retry-After": str(max(1, round(exc.retry_after)))}
    # Client mistakes are the client's to read in the body; at DEBUG an operator can still
    # follow one by its request id. Server-side failures always reach the log.
    level = logging.WARNING if status >= 500 else logging.DEBUG
    logger.log(level, "request %s answered %d: %s", _request_id(request.scope), status, exc)
    return _error_response(str(exc), status, headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error_response(exc.detail, exc.status_code, exc.headers)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    logger.error(
        "request %s failed with an internal error", _request_id(request.scope), exc_info=exc
    )
    return _error_response("internal server error", 500)


def _request_id(scope: Scope) -> str:
    return str(scope.get("state", {}).get("request_id", "-"))


class RequestIdMiddleware:
    """Honours ``X-Request-ID`` (or makes one), stores it in the scope and echoes it back."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # A random prefix per process and a counter: unique, and without uuid4's system
        # call per request (6% of the event loop's time under load, profiled).
        prefix = uuid.uuid4().hex[:12]
        counter = itertools.count(1)
        self._new_id = lambda: f"{prefix}-{next(counter)}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = ""
        for key, value in scope["headers"]:
            if key == b"x-request-id":
                candidate = value.decode("latin-1")
                if _REQUEST_ID.match(candidate):
                    request_id = candidate
                break
        if not request_id:
            request_id = self._new_id()
        scope.setdefault("state", {})["request_id"] = request_id
        encoded = request_id.encode("latin-1")

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", encoded)]
            await send(message)

        await self.app(scope, receive, send_with_id)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing more than ``limit`` bytes before reading them all.

    :raises PayloadTooLarge: declared or actual size over ``limit``.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the request body is over the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the request body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class Service:
    """What the routes share: the models, the metrics and the request path into a batcher."""

    def __init__(self, models: _Models, metrics: Metrics, max_body_bytes: int) -> None:
        self.models = models
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self._request_counters: dict[tuple[str, int], Any] = {}

    async def read(self, request: Request) -> bytes:
        return await read_body(request, self.max_body_bytes)

    @staticmethod
    def status_of(exc: BatchingError) -> int:
        return _status_of(exc)

    def deadline_of(self, request: Request, deployment: Deployment) -> float:
        timeout = deployment.config.batching.timeout
        asked = request.headers.get(TIMEOUT_HEADER)
        if asked is not None:
            try:
                asked_ms = float(asked)
            except ValueError:
                asked_ms = -1.0
            if not asked_ms > 0 or asked_ms != asked_ms:
                raise InvalidRequest(f"{TIMEOUT_HEADER} must be a positive number of ms")
            timeout = min(timeout, asked_ms / 1000)
        return asyncio.get_running_loop().time() + timeout

    async def infer(
        self, request: Request, deployment: Deployment, inputs: list[Any], deadline: float
    ) -> list[Any] | None:
        """Queue ``inputs`` and wait for their outputs; None when the client went away.

        :raises DeadlineExceeded: not served before ``deadline``.
        """
        batcher = deployment.batcher
        try:
            tokens = await deployment.tokens_of(inputs)
        except Exception as exc:
            raise UnprocessableInput(f"the model cannot tokenize this input: {exc}") from None
        future = batcher.submit(
            inputs, deadline=deadline, tokens=tokens, request_id=_request_id(request.scope)
        )
        disconnect = asyncio.ensure_future(_wait_for_disconnect(request.receive))
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.wait((future, disconnect), return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            future.cancel()
            raise DeadlineExceeded(
                f"the request was not served within its deadline of "
                f"{deployment.config.batching.timeout:g}s or {TIMEOUT_HEADER}"
            ) from None
        finally:
            disconnect.cancel()
        if not future.done():
            # The client hung up: cancelling the future drops its jobs before they reach
            # the model, wherever they are in the queue.
            future.cancel()
            return None
        return future.result()

    def record(self, deployment: Deployment, status: int, started: float) -> None:
        key = (deployment.name, status)
        counter = self._request_counters.get(key)
        if counter is None:
            counter = self.metrics.requests.labels(deployment.name, str(status))
            self._request_counters[key] = counter
        counter.inc()
        elapsed = asyncio.get_running_loop().time() - started
        self.metrics.request_latency.labels(deployment.name).observe(elapsed)


def create_app(
    models: ModelConfig | Sequence[ModelConfig] | None = None,
    *,
    builder: ModelBuilder = default_model_builder,
    instance_factory: InstanceFactory | None = None,
    max_body_bytes: int = 1 << 20,
    shutdown_timeout: float = 30.0,
    registry: CollectorRegistry | None = None,
) -> Starlette:
    """A Starlette app serving ``models`` with dynamic batching.

    :param models: one or several model configurations; None serves the default model
        (all-MiniLM-L6-v2 sentence embeddings) with default batching.
    :param builder: builds an unloaded model object from a configuration.
    :param instance_factory: how instances run (threads by default).
    :param max_body_bytes: larger request bodies get 413.
    :param shutdown_timeout: seconds the lifespan shutdown waits for accepted work.
    :param registry: the Prometheus registry to export; a fresh one by default.

    The models load in the background once the lifespan starts: ``/v2/health/live`` answers
    at once, ``/v2/health/ready`` only when every model is loaded and warm.
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
    deployments = [
        Deployment(
            config,
            _ConfigFactory(builder, config),
            events=metrics.for_model(config.name),
            instance_factory=instance_factory,
        )
        for config in configs
    ]
    service = Service(_Models(deployments), metrics, max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for deployment in deployments:
            deployment.start()
        try:
            yield
        finally:
            await asyncio.gather(
                *(deployment.stop(shutdown_timeout) for deployment in deployments)
            )

    async def predict(request: Request) -> Response:
        started = asyncio.get_running_loop().time()
        name = request.path_params.get("model_name")
        deployment = service.models.get(name) if name else service.models.default
        status = 500
        try:
            deadline = service.deadline_of(request, deployment)
            body = await service.read(request)
            inputs = parse_inputs(body, request.headers.get("content-type", ""))
            if deployment.takes_text:
                check_texts(inputs)
            outputs = await service.infer(request, deployment, inputs, deadline)
            if outputs is None:
                status = 499
                return Response(status_code=499)
            status = 200
            return Response(encode_outputs(deployment.name, outputs), media_type="application/json")
        except BatchingError as exc:
            status = _status_of(exc)
            raise
        finally:
            service.record(deployment, status, started)

    async def live(request: Request) -> Response:
        return Response(orjson.dumps({"live": True}), media_type="application/json")

    async def ready(request: Request) -> Response:
        is_ready = all(deployment.ready for deployment in deployments)
        return Response(
            orjson.dumps({"ready": is_ready}),
            status_code=200 if is_ready else 503,
            media_type="application/json",
        )

    async def metrics_endpoint(request: Request) -> Response:
        for deployment in deployments:
            batcher = deployment.batcher
            metrics.queue_depth.labels(deployment.name).set(batcher.queued_items)
            metrics.instances_ready.labels(deployment.name).set(batcher.ready_instances)
            if deployment.warmup_s:
                metrics.warmup.labels(deployment.name).set(deployment.warmup_s[-1])
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/", predict, methods=["POST"]),
        Route("/models/{model_name}", predict, methods=["POST"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        *v2_routes(service),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            BatchingError: _batching_error,
            HTTPException: _http_error,
            Exception: _unexpected_error,
        },
    )
    app.add_middleware(RequestIdMiddleware)
    app.state.service = service
    return app
