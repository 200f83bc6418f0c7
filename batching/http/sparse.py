"""The sparse-embedding door: ``POST /embed_sparse``, text-embeddings-inference's route, for
every model that returns SPLADE sparse vectors.

The wire format is :mod:`batching.codecs.sparse`; this module is its HTTP door over the data
plane, with the limits, deadlines, request ids and disconnects of every other door. Errors are
the plain doors' ``{"error": "..."}``. The body names the model (``"model"``); without it, the
first model served that returns sparse vectors answers. A model that is served but does not
return sparse vectors is a 400 naming the ones that do; an unknown model is a 404.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.codecs.sparse import (
    encode_sparse,
    parse_sparse_request,
    refused_length,
    serves_sparse,
    sparse_items,
)
from batching.errors import InvalidRequest, ModelNotFound, NotReady
from batching.plane import DataPlane
from batching.runtime.deployment import Deployment

from .errors import recorded
from .requests import read_unattributed_body

__all__ = ["sparse_routes", "sparse_model"]


def _is_sparse(deployment: Deployment) -> bool:
    """Whether ``deployment`` returns sparse vectors: its metadata says so once loaded; a
    SPLADE source says so before."""
    if deployment.metadata:
        return serves_sparse(deployment.metadata)
    return deployment.config.model_source.kind == "sparse"


def sparse_model(plane: DataPlane, name: str | None) -> Deployment:
    """The deployment that answers a sparse request for ``name`` (None: the first served).

    :raises ModelNotFound: no model of that name, or none returns sparse vectors.
    :raises InvalidRequest: the model is served but does not return sparse vectors.
    :raises NotReady: no name given, and the models that may be sparse are still loading.
    """
    sparse = [d.name for d in plane.deployments if _is_sparse(d)]
    served = ", ".join(repr(known) for known in sparse) or "none"
    if name is None:
        if sparse:
            return plane.deployment(sparse[0])
        if any(not d.metadata for d in plane.deployments):
            raise NotReady("the models are loading", retry_after=1.0)
        raise ModelNotFound("no model served here returns sparse embeddings")
    try:
        deployment = plane.deployment(name)
    except ModelNotFound:
        raise ModelNotFound(
            f"no model named {name!r} is served; the sparse models served: {served}"
        ) from None
    if not _is_sparse(deployment):
        raise InvalidRequest(
            f"model {name!r} does not return sparse embeddings; the sparse models served: {served}"
        )
    return deployment


def sparse_routes(plane: DataPlane, max_body_bytes: int) -> list[Route]:
    """The sparse route over ``plane``; bodies over ``max_body_bytes`` get 413."""

    async def embed_sparse(request: Request) -> Response:
        body = await read_unattributed_body(plane, request, max_body_bytes)
        parsed = parse_sparse_request(body)
        deployment = sparse_model(plane, parsed.model)
        with recorded(plane, deployment, request) as caller:
            metadata = deployment.metadata
            if not metadata:
                # Its prompts and limits are known once it has loaded.
                raise NotReady(f"model {deployment.name!r} is loading", retry_after=1.0)
            items = sparse_items(parsed, metadata)
            limit = refused_length(deployment, parsed.truncate, metadata)
            done = await plane.infer(deployment, items, caller, count=True, max_length=limit)
            answer = encode_sparse(done.outputs, parsed.return_tokens)
            return Response(answer, media_type="application/json")

    return [Route("/embed_sparse", embed_sparse, methods=["POST"])]
