"""KServe v2's generate extension, as Triton serves it: ``POST /v2/models/{m}/generate`` (the
whole text) and ``/generate_stream`` (server-sent events, one per piece of text), also under
``/versions/{v}``, for a generating model (text-generation, or an encoder-decoder's task:
its ``text_input`` is the input text). The body is :mod:`batching.kserve.generate`; errors
before the first byte are the v2 error body with their status, after it a
``data: {"error": "..."}`` event. A client that goes away stops its sequence at the next step.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from batching.answers import internal_message
from batching.codecs.completions import sse
from batching.codecs.task_parameters import task_items
from batching.errors import BatchingError
from batching.kserve.generate import answer, parse_generate
from batching.models.parameters import TaskItem, declared_parameters
from batching.plane import DataPlane, Generation

from .completions import SSE_HEADERS
from .errors import recorded, status_of, with_request_id
from .requests import read_body

__all__ = ["generate_routes"]

logger = logging.getLogger("batching")


async def _events(
    model: str, version: str, generation: Generation, request_id: str
) -> AsyncIterator[bytes]:
    asked = _asks_logprobs(generation)
    sent = 0
    try:
        async for text in generation.pieces():
            logprobs = generation.logprobs[sent:] if asked else None
            sent = len(generation.logprobs)
            yield sse(answer(model, version, text, logprobs))
    except Exception as exc:
        if isinstance(exc, BatchingError):
            message = with_request_id(str(exc), status_of(exc), request_id)
        else:
            logger.error("request %s failed while streaming", request_id, exc_info=exc)
            message = internal_message(request_id)
        yield sse({"error": message})
    finally:
        generation.close()


def _asks_logprobs(generation: Generation) -> bool:
    """Whether the item asked for its tokens' log-probabilities (the ``logprobs``
    parameter)."""
    item = generation.stream.item
    return isinstance(item, TaskItem) and item.get("logprobs") is not None


def generate_routes(plane: DataPlane, max_body_bytes: int) -> list[Route]:
    """The generate routes over ``plane``."""

    async def generate(request: Request, stream: bool) -> Response:
        name = request.path_params["model"]
        deployment = plane.deployment(name, request.path_params.get("version"))
        with recorded(plane, deployment, request) as caller:
            body = await read_body(request, max_body_bytes)
            parsed = parse_generate(body, set(declared_parameters(deployment.metadata)))
            (item,) = task_items(
                deployment, [parsed.text], parsed.parameters, where="the request's parameters"
            )
            version = deployment.config.version
            if stream:
                generation = await plane.generate(deployment, item, caller)
                return StreamingResponse(
                    _events(name, version, generation, caller.request_id),
                    media_type="text/event-stream",
                    headers=SSE_HEADERS,
                )
            (done,) = await plane.complete(deployment, [item], caller)
            logprobs = done.logprobs if _asks_logprobs(done) else None
            return Response(
                orjson.dumps(answer(name, version, done.text, logprobs)),
                media_type="application/json",
            )

    async def generate_whole(request: Request) -> Response:
        return await generate(request, stream=False)

    async def generate_stream(request: Request) -> Response:
        return await generate(request, stream=True)

    routes = []
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes.append(Route(prefix + "/generate", generate_whole, methods=["POST"]))
        routes.append(Route(prefix + "/generate_stream", generate_stream, methods=["POST"]))
    return routes
