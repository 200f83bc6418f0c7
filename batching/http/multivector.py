"""The per-token door: ``POST /embed_all``, every token's vector of each text (wire format:
:mod:`batching.codecs.multivector`).

Its items (``EmbedItem(output="tokens")``) go into the model's own queue through the data
plane, under the same limits as every request. Their tokens are counted first: with
``truncate: false`` a text over the model's limit is a 413, and the counts cap the batches the
items run in (:func:`batching.codecs.capability.per_token_cap`), since their answer grows with
their tokens. A model whose metadata does not list ``"tokens"`` among its outputs is a 422
naming the models that do.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.codecs.capability import TOKENS, per_token_cap
from batching.codecs.multivector import (
    check_lengths,
    encode_embed_all,
    length_limit,
    parse_embed_all_request,
)
from batching.service import DataPlane

from .errors import CLIENT_CLOSED, recorded
from .middleware import request_id_of
from .requests import disconnect_of, timeout_of
from .tokens import model_for, parsed_body, require

__all__ = ["multivector_routes"]


def multivector_routes(plane: DataPlane, max_body_bytes: int) -> list[Route]:
    """``/embed_all`` over ``plane``; bodies over ``max_body_bytes`` get 413."""

    async def embed_all(request: Request) -> Response:
        parsed = await parsed_body(plane, request, max_body_bytes, parse_embed_all_request)
        deployment = model_for(plane, parsed.model)
        with recorded(plane, deployment) as outcome:
            require(plane, deployment, TOKENS, "/embed_all")
            deadline = plane.deadline(deployment, timeout_of(request))
            metadata, name = deployment.metadata, deployment.name
            items = parsed.options.items(parsed.texts, metadata, name)
            limit = length_limit(parsed.options, metadata, name)
            counts = await plane.count_tokens(deployment, items, limit=limit)
            check_lengths(counts.lengths, parsed.options, metadata, name)
            outputs = await plane.infer(
                deployment,
                items,
                deadline=deadline,
                request_id=request_id_of(request.scope),
                disconnected=disconnect_of(request),
                tokens=counts.used,
                token_cap=per_token_cap(metadata, deployment.config.batching),
            )
            if outputs is None:
                outcome.status = CLIENT_CLOSED
                return Response(status_code=CLIENT_CLOSED)
            body = encode_embed_all(name, outputs)
            outcome.status = 200
            return Response(body, media_type="application/json")

    return [Route("/embed_all", embed_all, methods=["POST"])]
