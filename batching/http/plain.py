"""The plain door: ``POST /`` and ``POST /models/{name}`` with text or JSON bodies."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.codecs.inputs import input_specs
from batching.codecs.plain import check_inputs, encode_outputs, parse_inputs
from batching.service import DataPlane

from .errors import CLIENT_CLOSED, recorded
from .requests import infer_for_request, read_body, timeout_of

__all__ = ["plain_routes"]


def plain_routes(plane: DataPlane, max_body_bytes: int) -> list[Route]:
    """The plain routes over ``plane``; bodies over ``max_body_bytes`` get 413."""

    async def predict(request: Request) -> Response:
        deployment = plane.deployment(request.path_params.get("model_name"))
        with recorded(plane, deployment) as outcome:
            deadline = plane.deadline(deployment, timeout_of(request))
            body = await read_body(request, max_body_bytes)
            inputs = check_inputs(
                parse_inputs(body, request.headers.get("content-type", "")),
                input_specs(deployment.metadata),
            )
            outputs = await infer_for_request(plane, request, deployment, inputs, deadline)
            if outputs is None:
                outcome.status = CLIENT_CLOSED
                return Response(status_code=CLIENT_CLOSED)
            outcome.status = 200
            return Response(encode_outputs(deployment.name, outputs), media_type="application/json")

    return [
        Route("/", predict, methods=["POST"]),
        Route("/models/{model_name}", predict, methods=["POST"]),
    ]
