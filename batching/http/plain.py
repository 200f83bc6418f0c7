"""The plain door: ``POST /`` and ``POST /models/{name}`` with text or JSON bodies."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.codecs.embed_options import (
    encode_vector,
    read_options,
)
from batching.codecs.inputs import input_specs
from batching.codecs.plain import (
    check_inputs,
    check_texts,
    encode_embeddings,
    encode_outputs,
    media_request,
    parse_request,
)
from batching.codecs.plans import embeds, pooled_plan
from batching.codecs.sparse import options_request, refused_length, serves_sparse, sparse_items
from batching.codecs.task_parameters import declares_parameters, task_items
from batching.plane import DataPlane
from batching.runtime.deployment import Deployment

from .errors import recorded
from .requests import read_body

__all__ = ["plain_routes"]


def _embeds(deployment: Deployment, options: dict[str, object]) -> bool:
    """Whether the request goes the embedding way (:func:`~batching.codecs.plans.embeds`)."""
    return embeds(
        deployment,
        options,
        lambda: (
            f"model {deployment.name!r} is not an embedding model: it takes no options "
            f"({', '.join(repr(key) for key in options)}); send only inputs"
        ),
    )


def plain_routes(plane: DataPlane, max_body_bytes: int) -> list[Route]:
    """The plain routes over ``plane``; bodies over ``max_body_bytes`` get 413."""

    async def predict(request: Request) -> Response:
        deployment = plane.deployment(request.path_params.get("model_name"))
        with recorded(plane, deployment, request) as caller:
            body = await read_body(request, max_body_bytes)
            content_type = request.headers.get("content-type", "")
            parsed = media_request(body, content_type, deployment.metadata) or parse_request(
                body, content_type
            )
            inputs = check_inputs(parsed.inputs, input_specs(deployment.metadata))
            limit = None
            if parsed.options and serves_sparse(deployment.metadata):
                # A sparse model's options: its items, and the 413 of truncate: false.
                asked = options_request(check_texts(inputs), parsed.options, where="the request")
                inputs = sparse_items(asked, deployment.metadata)
                limit = refused_length(deployment, parsed.options.get("truncate"))
            elif declares_parameters(deployment):
                # A task's parameters (every key beside inputs, or in "parameters").
                inputs = task_items(deployment, inputs, parsed.options, where="the request")
            elif _embeds(deployment, parsed.options):
                options = read_options(parsed.options, where="the request")
                plan = pooled_plan(deployment, check_texts(inputs), options)
                answer = await plane.embed(deployment, plan, caller)
                as_base64 = plan.options.base64
                body = encode_embeddings(
                    deployment.name,
                    [encode_vector(vector, as_base64) for vector in answer.vectors],
                    truncated=answer.truncated,
                    tokens=answer.tokens,
                )
                return Response(body, media_type="application/json")
            done = await plane.infer(deployment, inputs, caller, max_length=limit)
            return Response(
                encode_outputs(deployment.name, done.outputs), media_type="application/json"
            )

    return [
        Route("/", predict, methods=["POST"]),
        Route("/models/{model_name}", predict, methods=["POST"]),
    ]
