"""The per-token door: ``POST /embed_all``, every token's vector of each text (wire format and
plan: :mod:`batching.codecs.multivector`).

Its items (``EmbedItem(output="tokens")``) go into the model's own queue through the data
plane, under the same limits as every request; their tokens are counted first, for the 413 of
``truncate: false`` and for the token cap of the batches they run in. A model whose metadata
does not list ``"tokens"`` among its outputs is a 422 naming the models that do.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.codecs.capability import TOKENS
from batching.codecs.multivector import encode_embed_all, parse_embed_all_request
from batching.codecs.plans import per_token_plan
from batching.plane import DataPlane

from .errors import recorded
from .tokens import model_for, parsed_body, require

__all__ = ["multivector_routes"]


def multivector_routes(plane: DataPlane, max_body_bytes: int) -> list[Route]:
    """``/embed_all`` over ``plane``; bodies over ``max_body_bytes`` get 413."""

    async def embed_all(request: Request) -> Response:
        parsed = await parsed_body(plane, request, max_body_bytes, parse_embed_all_request)
        deployment = model_for(plane, parsed.model)
        with recorded(plane, deployment, request) as caller:
            require(plane, deployment, TOKENS, "/embed_all")
            plan = per_token_plan(deployment, parsed.texts, parsed.options)
            answer = await plane.per_token(deployment, plan, caller)
            body = encode_embed_all(deployment.name, answer)
            return Response(body, media_type="application/json")

    return [Route("/embed_all", embed_all, methods=["POST"])]
