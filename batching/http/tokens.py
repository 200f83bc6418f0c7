"""The token doors: ``POST /tokenize`` and ``POST /decode`` (wire format:
:mod:`batching.codecs.tokens`).

Their items go into the model's own queue through the data plane, like every other request's:
they are admitted (503), timed (504), dropped when the client hangs up, and counted, under the
same limits (items per request, body size). The body's optional ``"model"`` picks a served
model, the default one otherwise; a model whose metadata does not declare ``"tokenize": true``
is a 422 naming the models that do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.codecs.capability import TOKENIZE, capable, resolve_prompt, vocab_size
from batching.codecs.tokens import (
    check_ids,
    encode_decoded,
    encode_tokens,
    parse_decode_request,
    parse_tokenize_request,
)
from batching.errors import BatchingError, NotReady, UnprocessableInput
from batching.plane import DataPlane
from batching.runtime.deployment import Deployment

from .errors import recorded, status_of
from .requests import read_unattributed_body

__all__ = ["model_for", "parsed_body", "require", "token_routes"]

Parsed = TypeVar("Parsed")


async def parsed_body(
    plane: DataPlane, request: Request, max_body_bytes: int, parse: Callable[[bytes], Parsed]
) -> Parsed:
    """The body, read within ``max_body_bytes`` and parsed; a refusal before the model is
    known is counted under model "" (as the ``/v1`` doors count theirs)."""
    started = plane.now()
    body = await read_unattributed_body(plane, request, max_body_bytes)
    try:
        return parse(body)
    except BatchingError as exc:
        plane.record(None, status_of(exc), started)
        raise


def model_for(plane: DataPlane, name: str | None) -> Deployment:
    """The deployment a body's ``"model"`` names (the default one when None); an unknown name
    is a 404, counted under model ""."""
    started = plane.now()
    try:
        return plane.deployment(name)
    except BatchingError as exc:
        plane.record(None, status_of(exc), started)
        raise


def require(plane: DataPlane, deployment: Deployment, capability: str, route: str) -> None:
    """Refuse a model that does not declare ``capability``: 503 while it loads (its metadata
    is not known yet), 422 naming the served models that do once it is.

    :raises NotReady: the model has not loaded yet.
    :raises UnprocessableInput: the model does not serve ``route``.
    """
    if not deployment.metadata:
        plane.refused(deployment.name, "not_ready")
        raise NotReady(f"model {deployment.name!r} is not ready", retry_after=1.0)
    if capable(deployment.metadata, capability):
        return
    able = [d.name for d in plane.deployments if capable(d.metadata, capability)]
    which = (
        "the models that do: " + ", ".join(repr(name) for name in able)
        if able
        else "no model served here does (or none has loaded yet)"
    )
    raise UnprocessableInput(f"model {deployment.name!r} does not serve {route}; {which}")


def token_routes(plane: DataPlane, max_body_bytes: int) -> list[Route]:
    """``/tokenize`` and ``/decode`` over ``plane``; bodies over ``max_body_bytes`` get 413."""

    async def tokenize(request: Request) -> Response:
        parsed = await parsed_body(plane, request, max_body_bytes, parse_tokenize_request)
        deployment = model_for(plane, parsed.model)
        with recorded(plane, deployment, request) as caller:
            require(plane, deployment, TOKENIZE, "/tokenize")
            prompt = resolve_prompt(deployment.metadata, parsed.prompt_name, deployment.name)
            done = await plane.infer(deployment, list(parsed.items(prompt)), caller)
            body = encode_tokens(deployment.name, done.outputs)
            return Response(body, media_type="application/json")

    async def decode(request: Request) -> Response:
        parsed = await parsed_body(plane, request, max_body_bytes, parse_decode_request)
        deployment = model_for(plane, parsed.model)
        with recorded(plane, deployment, request) as caller:
            require(plane, deployment, TOKENIZE, "/decode")
            check_ids(parsed, vocab_size(deployment.metadata), deployment.name)
            done = await plane.infer(deployment, list(parsed.items()), caller)
            body = encode_decoded(deployment.name, done.outputs)
            return Response(body, media_type="application/json")

    return [
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/decode", decode, methods=["POST"]),
    ]
