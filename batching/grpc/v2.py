"""The KServe v2 protocol over gRPC (``inference.GRPCInferenceService``), as Triton serves it.

Health, server and model metadata, model readiness, configuration and statistics, the
repository index and ``ModelInfer``; errors are gRPC status codes (:mod:`.errors`). What the
protocol means lives in :mod:`batching.kserve`, as for the HTTP door; this module is its gRPC
door, a codec over :class:`~batching.service.DataPlane`. The streaming, shared-memory,
repository-control, trace and log RPCs answer ``UNIMPLEMENTED``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from batching.answers import answer_log
from batching.codecs.embedding import run_embedding
from batching.codecs.multivector import run_per_token
from batching.errors import BatchingError, ModelNotFound
from batching.kserve import describe
from batching.kserve.infer import (
    embedding_parameters,
    embedding_plan,
    embedding_tensors,
    items_of,
    output_tensors,
    timeout_parameter,
    token_answer_parameters,
    token_answer_tensors,
    token_plan_of,
)
from batching.runtime.deployment import Deployment
from batching.service import DataPlane

from .errors import CANCELLED, INTERNAL, status_of
from .tensors import encode_infer_response, parse_infer_request

__all__ = ["InferenceServicer"]

logger = logging.getLogger("batching")

_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")

#: A servicer method: ``(self, request, context) -> response``.
Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


def _lower(first: float | None, second: float | None) -> float | None:
    return second if first is None else first if second is None else min(first, second)


def _parsed(document: Any, message: Any) -> Any:
    """``document`` (a dict in the message's JSON form) as ``message``; keys the message has no
    field for are left out, so :mod:`batching.kserve.describe` may say more than the proto."""
    return json_format.ParseDict(document, message, ignore_unknown_fields=True)


async def _abort(context: Any, code: grpc.StatusCode, status: int, message: str, rid: str) -> None:
    answer_log.answered(f"gRPC request {rid} ({code.name})", status, message)
    await context.abort(code, message)


def _answers_errors(method: Handler) -> Handler:
    """Answer a :class:`BatchingError` with its status code and anything else with INTERNAL
    (logged, never sent: the caller sees no traceback)."""

    @functools.wraps(method)
    async def handler(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except BatchingError as exc:
            code, status = status_of(exc)
            await _abort(context, code, status, str(exc), "-")
        except Exception:
            logger.exception("a gRPC %s call failed with an internal error", method.__name__)
            await context.abort(INTERNAL[0], "internal server error")

    return handler  # type: ignore[return-value]


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """``inference.GRPCInferenceService`` over ``plane``."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.models = plane.deployments
        # Request ids as the HTTP middleware makes them: a random prefix and a counter.
        prefix = uuid.uuid4().hex[:12]
        counter = itertools.count(1)
        self._new_id: Callable[[], str] = lambda: f"{prefix}-g{next(counter)}"

    def _deployment(self, name: str, version: str) -> Deployment:
        return self.plane.deployment(name, version or None)

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.models.ready)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        # A model that is not served is not ready, as Triton answers (and tritonclient's HTTP
        # is_model_ready says of the 404): a bool, not an error.
        try:
            deployment = self._deployment(request.name, request.version)
        except ModelNotFound:
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=deployment.ready)

    @_answers_errors
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return _parsed(describe.server_metadata(), service_pb2.ServerMetadataResponse())

    @_answers_errors
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        deployment = self._deployment(request.name, request.version)
        return _parsed(describe.model_metadata(deployment), service_pb2.ModelMetadataResponse())

    @_answers_errors
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        deployment = self._deployment(request.name, request.version)
        config = _parsed(describe.model_config(deployment), model_config_pb2.ModelConfig())
        return service_pb2.ModelConfigResponse(config=config)

    @_answers_errors
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        # No name means every model, as in Triton.
        if request.name:
            deployments = [self._deployment(request.name, request.version)]
        else:
            deployments = list(self.models)
        return _parsed(describe.statistics(deployments), service_pb2.ModelStatisticsResponse())

    @_answers_errors
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        return _parsed(
            {"models": describe.repository_index(self.models)},
            service_pb2.RepositoryIndexResponse(),
        )

    @_answers_errors
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        deployment = self._deployment(request.model_name, request.model_version)
        rid = self._request_id(request, context)
        plane = self.plane
        started = plane.now()
        status = INTERNAL[1]
        try:
            parsed = parse_infer_request(request)
            # The caller's gRPC deadline, lowered further by the `timeout` parameter.
            asked = _lower(context.time_remaining(), timeout_parameter(parsed.parameters))
            deadline = plane.deadline(deployment, asked)
            items = items_of(deployment, parsed)
            per_token = token_plan_of(deployment, parsed, items)
            plan = None if per_token is not None else embedding_plan(deployment, parsed, items)
            parameters: dict[str, Any] = {}
            if per_token is not None:
                tokens = await run_per_token(
                    plane, deployment, per_token, deadline=deadline, request_id=rid
                )
                if tokens is None:
                    status = CANCELLED
                    await context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled")
                assert tokens is not None
                tensors = token_answer_tensors(parsed, tokens)
                parameters = token_answer_parameters(tokens)
            elif plan is None:
                outputs = await self._infer(deployment, items, deadline, rid)
                if outputs is None:
                    status = CANCELLED
                    await context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled")
                tensors = output_tensors(deployment, outputs)
            else:
                answer = await run_embedding(
                    plane, deployment, plan, deadline=deadline, request_id=rid
                )
                if answer is None:
                    status = CANCELLED
                    await context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled")
                assert answer is not None
                tensors = embedding_tensors(deployment, plan, answer)
                parameters = embedding_parameters(answer)
            response = encode_infer_response(
                deployment.name, deployment.config.version, parsed.id, tensors, parameters
            )
            status = 200
            return response
        except BatchingError as exc:
            code, status = status_of(exc)
            await _abort(context, code, status, str(exc), rid)
        except asyncio.CancelledError:
            # grpc cancels the handler when the caller cancels or its deadline passes.
            remaining = context.time_remaining()
            status = 504 if remaining is not None and remaining <= 0 else CANCELLED
            if status == 504:
                plane.refused(deployment.name, "deadline")
            raise
        finally:
            plane.record(deployment, status, started)

    async def _infer(
        self, deployment: Deployment, items: list[Any], deadline: float, rid: str
    ) -> list[Any] | None:
        """``items`` through the data plane. grpc cancels this handler when the call ends
        (cancelled, or past its deadline); the data plane then drops the items wherever they
        are in the queue, as it does for a closed HTTP client."""
        return await self.plane.infer(deployment, items, deadline=deadline, request_id=rid)

    def _request_id(self, request: Any, context: Any) -> str:
        """The caller's ``x-request-id`` metadata, else the request's ``id``, else a new one."""
        for key, value in context.invocation_metadata() or ():
            if key == "x-request-id" and isinstance(value, str) and _REQUEST_ID.match(value):
                return value
        if _REQUEST_ID.match(request.id):
            return str(request.id)
        return self._new_id()
