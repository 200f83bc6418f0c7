"""The KServe v2 protocol over gRPC (``inference.GRPCInferenceService``), as Triton serves it.

Health, server and model metadata, model readiness, configuration and statistics, the
repository index and ``ModelInfer``; errors are gRPC status codes (:mod:`.errors`). What the
protocol means lives in :mod:`batching.kserve`, as for the HTTP door; this module is its gRPC
door, a codec over :class:`~batching.plane.DataPlane`. ``ModelStreamInfer`` streams a
generating model's pieces (:mod:`.streams`). The shared-memory and trace RPCs answer
``UNIMPLEMENTED``; repository control and the log settings are :mod:`.control`'s.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from batching.answers import answer_log, internal_message
from batching.errors import BatchingError, ModelNotFound, PayloadTooLarge
from batching.kserve import describe
from batching.kserve.dispatch import answer_infer
from batching.kserve.infer import items_of
from batching.kserve.tensors import InferRequest
from batching.models.items import Item
from batching.plane import Caller, DataPlane
from batching.runtime.deployment import Deployment

from .calls import OFFLOAD_BYTES, REQUEST_ID_KEY, refuse
from .errors import CANCELLED, INTERNAL, status_of
from .streams import model_stream_infer
from .tensors import check_item_count, encode_infer_response, parse_infer_request

__all__ = ["InferenceServicer"]

logger = logging.getLogger("batching")

_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")

#: A servicer method: ``(self, request, context) -> response``.
Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


def _parsed(document: Any, message: Any) -> Any:
    """``document`` (a dict in the message's JSON form) as ``message``; keys the message has no
    field for are left out, so :mod:`batching.kserve.describe` may say more than the proto."""
    return json_format.ParseDict(document, message, ignore_unknown_fields=True)


def _refused(context: Any, code: grpc.StatusCode, status: int, message: str, rid: str) -> None:
    """Answer ``code`` with ``message`` (and, for a 500, the request id), logged as every door
    logs its error answers. Raises nothing: see :mod:`.calls` for why not ``context.abort``."""
    if status == INTERNAL[1] and rid not in message:
        message = f"{message} (request id {rid})"
    answer_log.answered(f"gRPC request {rid} ({code.name})", status, message)
    refuse(context, code, message, rid)


def _answers_errors(method: Handler) -> Handler:
    """Answer a :class:`BatchingError` with its status code and anything else with INTERNAL
    (logged with its traceback under the request id, never sent: the caller sees no class,
    path or address). The exception is let go before the answer is set."""

    @functools.wraps(method)
    async def handler(self: InferenceServicer, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except BatchingError as exc:
            (code, status), message = status_of(exc), str(exc)
            rid = None
        except Exception:
            rid = self._request_id(request, context)
            logger.exception(
                "gRPC request %s (%s) failed with an internal error", rid, method.__name__
            )
            (code, status), message = INTERNAL, internal_message(rid)
        _refused(context, code, status, message, rid or self._request_id(request, context))
        return None

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

    @_answers_errors
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    @_answers_errors
    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.models.ready)

    @_answers_errors
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
        context.set_trailing_metadata(((REQUEST_ID_KEY, rid),))
        plane = self.plane
        # The caller's gRPC deadline; the request's `timeout` parameter may lower it.
        caller = Caller(rid, context.time_remaining())
        started = plane.now()
        status = INTERNAL[1]
        # Set in the except blocks, answered after them: nothing raised while an exception
        # is being handled, so no traceback keeps the request alive (see .calls).
        failure: tuple[grpc.StatusCode, str] | None = None
        try:
            try:
                check_item_count(request, deployment.config.batching.max_items_per_request)
            except PayloadTooLarge:
                plane.refused(deployment.name, "too_large")
                raise
            if request.ByteSize() > OFFLOAD_BYTES:
                # Decoding a large message's elements would hold up every other call.
                parsed, items = await asyncio.to_thread(_decoded, deployment, request)
            else:
                parsed, items = _decoded(deployment, request)
            answer = await answer_infer(plane, deployment, parsed, items, caller)
            response = encode_infer_response(
                deployment.name,
                deployment.config.version,
                parsed.id,
                answer.tensors,
                answer.parameters,
            )
            status = 200
            return response
        except BatchingError as exc:
            code, status = status_of(exc)
            failure = (code, str(exc))
        except asyncio.CancelledError:
            # grpc cancels the handler when the caller cancels or its deadline passes.
            remaining = context.time_remaining()
            status = 504 if remaining is not None and remaining <= 0 else CANCELLED
            if status == 504:
                plane.refused(deployment.name, "deadline")
            raise
        except Exception:
            logger.exception("gRPC request %s failed with an internal error", rid)
            failure = (INTERNAL[0], internal_message(rid))
        finally:
            plane.record(deployment, status, started)
        assert failure is not None
        _refused(context, failure[0], status, failure[1], rid)
        return None

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> Any:
        """Decoupled responses for a generating model (:mod:`.streams`)."""
        async for response in model_stream_infer(
            self.plane, request_iterator, context, self._new_id
        ):
            yield response

    def count_refused(self, status: int, reason: str | None, started: float) -> None:
        """Count a call refused before its method ran (:mod:`.calls`), under model ""."""
        self.plane.record(None, status, started)
        if reason is not None:
            self.plane.refused("", reason)

    def _request_id(self, request: Any, context: Any) -> str:
        """The caller's ``x-request-id`` metadata, else the request's ``id``, else a new one."""
        for key, value in context.invocation_metadata() or ():
            if key == REQUEST_ID_KEY and isinstance(value, str) and _REQUEST_ID.match(value):
                return value
        own = getattr(request, "id", "")
        if isinstance(own, str) and _REQUEST_ID.match(own):
            return own
        return self._new_id()


def _decoded(deployment: Deployment, request: Any) -> tuple[InferRequest, Sequence[Item]]:
    """``request``'s tensors, and the items they carry for ``deployment``."""
    parsed = parse_infer_request(request)
    return parsed, items_of(deployment, parsed)
