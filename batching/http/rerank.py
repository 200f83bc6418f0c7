"""The rerank door: ``POST /v1/rerank`` for every text-pair model (cross-encoders, NLI).

The wire format and how a relevance score is read from the model's output are
:mod:`batching.codecs.rerank`. Each document is one item, the pair
``{"text": query, "text_pair": document}``, so a request with many documents is batched,
split and re-joined like any other. Errors use OpenAI's error document, as the other ``/v1``
routes do (:func:`batching.http.openai.openai_endpoint`); a model that is not served, or does
not take text pairs (its metadata declares no ``text`` and ``text_pair`` inputs), is a 404
with code ``model_not_found``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.codecs.inputs import takes_pairs
from batching.codecs.rerank import encode_rerank, pair_items, parse_rerank_request, relevance_of
from batching.documents import listed
from batching.plane import DataPlane

from .errors import recorded
from .openai import ANY_METHOD, openai_endpoint, served_model
from .requests import read_unattributed_body

__all__ = ["rerank_routes"]


def rerank_routes(plane: DataPlane, max_body_bytes: int) -> list[Route]:
    """The rerank route over ``plane``; bodies over ``max_body_bytes`` get 413."""

    async def rerank(request: Request) -> Response:
        body = await read_unattributed_body(plane, request, max_body_bytes)
        parsed = parse_rerank_request(body)
        deployment = served_model(plane, parsed.model, takes_pairs, "a text-pair (rerank)")
        with recorded(plane, deployment, request) as caller:
            items = pair_items(parsed)
            done = await plane.infer(deployment, items, caller, count=True)
            labels = [str(label) for label in listed(deployment.metadata.get("labels"))]
            scores = [relevance_of(output, labels, parsed.model) for output in done.outputs]
            answer = encode_rerank(parsed, parsed.model, scores, done.tokens or 0)
            return Response(answer, media_type="application/json")

    return [Route("/v1/rerank", openai_endpoint(rerank, "POST"), methods=ANY_METHOD)]
