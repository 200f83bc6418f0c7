"""The KServe v2 protocol over HTTP, as Triton Inference Server serves it.

Health, server and model metadata, model readiness, configuration and statistics (Triton's
extensions), the repository index and ``infer`` with JSON or binary tensor data; errors are
``{"error": "..."}`` with Triton's status codes. What the protocol means lives in
:mod:`batching.kserve`; this module is its HTTP door.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.errors import InvalidRequest
from batching.kserve import describe
from batching.kserve.dispatch import answer_infer
from batching.kserve.infer import items_of
from batching.kserve.request import parse_infer_request
from batching.kserve.response import encode_infer_response
from batching.plane import DataPlane
from batching.runtime.deployment import Deployment

from .errors import recorded
from .requests import read_body

__all__ = ["v2_routes"]

HEADER_LENGTH = "inference-header-content-length"


def _json(document: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(document), status_code=status, media_type="application/json")


def _header_length(request: Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(
            f"Inference-Header-Content-Length must be an integer: {raw!r}"
        ) from None


def v2_routes(plane: DataPlane, max_body_bytes: int) -> list[Route]:
    """The v2 routes over ``plane``; bodies over ``max_body_bytes`` get 413."""
    models = plane.deployments

    def deployment_of(request: Request) -> Deployment:
        params = request.path_params
        return models.get(params["model_name"], params.get("version"))

    async def server_metadata(request: Request) -> Response:
        return _json(describe.server_metadata())

    async def metadata(request: Request) -> Response:
        return _json(describe.model_metadata(deployment_of(request)))

    async def config(request: Request) -> Response:
        return _json(describe.model_config(deployment_of(request)))

    async def model_statistics(request: Request) -> Response:
        return _json(describe.statistics([deployment_of(request)]))

    async def all_statistics(request: Request) -> Response:
        return _json(describe.statistics(models))

    async def ready(request: Request) -> Response:
        deployment = deployment_of(request)
        return _json(
            {"name": deployment.name, "ready": deployment.ready}, 200 if deployment.ready else 503
        )

    async def repository_index(request: Request) -> Response:
        return _json(describe.repository_index(models))

    async def infer(request: Request) -> Response:
        deployment = deployment_of(request)
        with recorded(plane, deployment, request) as caller:
            header_length = _header_length(request)
            body = await read_body(request, max_body_bytes)
            parsed = parse_infer_request(body, header_length)
            items = items_of(deployment, parsed)
            answer = await answer_infer(plane, deployment, parsed, items, caller)
            body, length = encode_infer_response(
                deployment.name,
                deployment.config.version,
                parsed.id,
                answer.tensors,
                parsed.binary_output_names(describe.output_names(deployment)),
                answer.parameters,
            )
            if length is None:
                return Response(body, media_type="application/json")
            return Response(
                body,
                media_type="application/octet-stream",
                headers={"Inference-Header-Content-Length": str(length)},
            )

    model = "/v2/models/{model_name}"
    versioned = "/v2/models/{model_name}/versions/{version}"
    routes = [
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/repository/index", repository_index, methods=["POST"]),
        # Before the model routes: Triton reads /v2/models/stats as every model's statistics.
        Route("/v2/models/stats", all_statistics, methods=["GET"]),
    ]
    for prefix in (model, versioned):
        routes += [
            Route(prefix, metadata, methods=["GET"]),
            Route(prefix + "/config", config, methods=["GET"]),
            Route(prefix + "/stats", model_statistics, methods=["GET"]),
            Route(prefix + "/ready", ready, methods=["GET"]),
            Route(prefix + "/infer", infer, methods=["POST"]),
        ]
    return routes
