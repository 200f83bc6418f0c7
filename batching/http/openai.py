"""The OpenAI-compatible door: ``POST /v1/embeddings`` for every embedding model served, and
``GET /v1/models`` and ``GET /v1/models/{model}`` for every model, with what each serves
(:mod:`batching.codecs.served`).

The official ``openai`` SDK (and LangChain's ``OpenAIEmbeddings`` with
``check_embedding_ctx_length=False``) works against ``{server}/v1`` with any API key. The wire
format and its limits are :mod:`batching.codecs.openai`; this module is its HTTP door over the
data plane, like the others. Every error on these routes is OpenAI's error document
``{"error": {"message", "type", "param", "code"}}`` (see :func:`openai_endpoint`); an unknown
model, or a served model that is not an embedding model, is a 404 with code
``model_not_found``. A model is listed, and known to be an embedding model, once its first
instance has loaded (its metadata says so); before that a request to it is tried, and
answered 503 while it loads.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.answers import answer_log, internal_message
from batching.codecs.embed_options import EmbedOptions
from batching.codecs.openai import (
    MAX_INPUT_TOKENS,
    check_token_limits,
    code_of,
    encode_embeddings,
    encode_model,
    encode_models,
    error_document,
    is_embedding_model,
    parse_embeddings_request,
)
from batching.codecs.plans import pooled_plan
from batching.codecs.served import served
from batching.errors import (
    BatchingError,
    ClientGone,
    DeadlineExceeded,
    InferenceFailed,
    ModelNotFound,
    NotReady,
    Unavailable,
)
from batching.plane import DataPlane, TokenLimits
from batching.runtime.deployment import Deployment

from .connections import hold_resends
from .errors import recorded, status_of, with_request_id
from .middleware import request_id_of
from .requests import read_unattributed_body

__all__ = ["ANY_METHOD", "openai_endpoint", "openai_error", "openai_routes", "served_model"]

logger = logging.getLogger("batching")

Endpoint = Callable[[Request], Awaitable[Response]]

#: OpenAI's limits on each input's tokens, counted beside the model's (and for usage).
OPENAI_LIMITS = TokenLimits(MAX_INPUT_TOKENS + 1, check_token_limits)

#: Every method a route of these doors takes, to answer the wrong ones itself.
ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _json(body: bytes, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def openai_error(exc: BatchingError, request: Request) -> Response:
    """``exc`` as OpenAI's error document, under the status :func:`status_of` gives it.

    A 503 says when to retry in ``retry-after`` (seconds) and ``retry-after-ms``, which the
    ``openai`` SDK honours; a 504 (the deadline passed) and a 500 (the model failed on the
    input) say ``x-should-retry: false``, so the SDK does not send the same request again.
    """
    status = status_of(exc)
    param = getattr(exc, "param", None)
    if isinstance(exc, ModelNotFound):
        param = "model"
    headers: dict[str, str] = {}
    if isinstance(exc, Unavailable):
        headers["retry-after"] = str(max(1, math.ceil(exc.retry_after)))
        headers["retry-after-ms"] = str(max(1, round(exc.retry_after * 1000)))
        headers["x-should-retry"] = "true"
        hold_resends(request.scope, exc)
    elif isinstance(exc, DeadlineExceeded | InferenceFailed):
        headers["x-should-retry"] = "false"
    message = with_request_id(str(exc), status, request_id_of(request.scope))
    answer_log.answered(f"request {request_id_of(request.scope)}", status, message)
    error_type = "invalid_request_error" if status < 500 else "server_error"
    return _json(
        error_document(
            message, error_type, param if isinstance(param, str) else None, code_of(exc)
        ),
        status,
        headers,
    )


def openai_endpoint(handler: Endpoint, method: str) -> Endpoint:
    """``handler`` for ``method``, answering every error in OpenAI's shape: the error tree's,
    an unexpected one (500), and another method (405). Register it with
    ``methods=ANY_METHOD``, so that Starlette's own 405 (``{"error": "..."}``) never answers
    on this route."""
    allowed = {method, "HEAD"} if method == "GET" else {method}

    async def endpoint(request: Request) -> Response:
        if request.method not in allowed:
            return _json(
                error_document(
                    f"{request.method} is not allowed on {request.url.path}; use {method}",
                    "invalid_request_error",
                    None,
                    "method_not_allowed",
                ),
                405,
                {"allow": ", ".join(sorted(allowed))},
            )
        try:
            return await handler(request)
        except ClientGone:
            raise  # nobody to answer: the app's handler counts it
        except BatchingError as exc:
            return openai_error(exc, request)
        except Exception as exc:
            request_id = request_id_of(request.scope)
            logger.error("request %s failed with an internal error", request_id, exc_info=exc)
            message = internal_message(request_id)
        return _json(error_document(message, "server_error", None, "internal_error"), 500)

    return endpoint


def served_model(
    plane: DataPlane, name: str, fits: Callable[[Mapping[str, object]], bool], kind: str
) -> Deployment:
    """The deployment serving ``name``, if it is a ``kind`` model (``fits`` its metadata).
    A model still loading has no metadata yet: it is taken as it is, and its request will
    be answered 503 until it is ready.

    :raises ModelNotFound: no such model, or not a ``kind`` model.
    """
    try:
        deployment = plane.deployment(name)
    except ModelNotFound:
        known = [d.name for d in plane.deployments if d.metadata and fits(d.metadata)]
        served = ", ".join(repr(known_name) for known_name in known) or "none loaded yet"
        raise ModelNotFound(
            f"The model {name!r} does not exist; the {kind} models served here: {served}"
        ) from None
    if deployment.metadata and not fits(deployment.metadata):
        raise ModelNotFound(f"The model {name!r} is served here, but it is not {kind} model")
    return deployment


def openai_routes(plane: DataPlane, max_body_bytes: int) -> list[Route]:
    """The OpenAI-compatible routes over ``plane``; bodies over ``max_body_bytes`` get 413."""
    created = int(time.time())

    async def embeddings(request: Request) -> Response:
        body = await read_unattributed_body(plane, request, max_body_bytes)
        parsed = parse_embeddings_request(body)
        deployment = served_model(plane, parsed.model, is_embedding_model, "an embedding")
        with recorded(plane, deployment, request) as caller:
            if not deployment.metadata and parsed.options != EmbedOptions(
                encoding=parsed.options.encoding, base64=parsed.options.base64
            ):
                raise NotReady(f"model {parsed.model!r} is loading", retry_after=1.0)
            plan = pooled_plan(
                deployment,
                parsed.texts,
                parsed.options,
                model=parsed.model,
                encoding_name="encoding_format",
            )
            answer = await plane.embed(deployment, plan, caller, OPENAI_LIMITS)
            result = encode_embeddings(
                parsed.model,
                answer.vectors,
                parsed.encoding_format,
                answer.tokens or 0,
                answer.truncated,
            )
            return _json(result)

    def described(deployment: Deployment) -> dict[str, object]:
        return served(deployment.name, deployment.metadata, deployment.config.task)

    async def models(request: Request) -> Response:
        listed = [(d.name, described(d)) for d in plane.deployments]
        return _json(encode_models(listed, created))

    async def model(request: Request) -> Response:
        name = request.path_params["model"]
        try:
            deployment = plane.deployment(name)
        except ModelNotFound:
            known = ", ".join(repr(d.name) for d in plane.deployments)
            raise ModelNotFound(
                f"The model {name!r} does not exist; served here: {known}"
            ) from None
        if not deployment.metadata:
            raise NotReady(f"model {name!r} is loading", retry_after=1.0)
        return _json(encode_model(name, created, described(deployment)))

    return [
        Route("/v1/embeddings", openai_endpoint(embeddings, "POST"), methods=ANY_METHOD),
        Route("/v1/models", openai_endpoint(models, "GET"), methods=ANY_METHOD),
        Route("/v1/models/{model}", openai_endpoint(model, "GET"), methods=ANY_METHOD),
    ]
