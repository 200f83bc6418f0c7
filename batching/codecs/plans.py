"""An embedding request's plan for the deployment it goes to, every door's: its texts and
options against the model's metadata, with the server's truncation default
(:func:`~batching.codecs.embed_options.plan_embedding`,
:func:`~batching.codecs.multivector.token_plan`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from batching.errors import InvalidRequest, NotReady
from batching.runtime.deployment import Deployment

from .embed_options import EmbedOptions, EmbedPlan, embedding_info, plan_embedding
from .multivector import token_plan
from .openai import is_embedding_model

__all__ = ["embeds", "pooled_plan", "per_token_plan"]


def embeds(
    deployment: Deployment, options: Mapping[str, object], refusal: Callable[[], str]
) -> bool:
    """Whether a request goes the embedding way: its model declares embedding options, or
    the request sets some (then the model must be an embedding model).

    :raises NotReady: options sent before the model has said what it takes.
    :raises InvalidRequest: options sent to a model that is not an embedding model, with the
        door's ``refusal`` (what it says of the options it got).
    """
    metadata = deployment.metadata
    if not options:
        return embedding_info(metadata) is not None and is_embedding_model(metadata)
    if not metadata:
        raise NotReady(f"model {deployment.name!r} is loading", retry_after=1.0)
    if not is_embedding_model(metadata):
        raise InvalidRequest(refusal())
    return True


def pooled_plan(
    deployment: Deployment,
    texts: Sequence[str],
    options: EmbedOptions,
    *,
    model: str | None = None,
    encoding_name: str = "encoding",
) -> EmbedPlan:
    """The pooled vectors' plan; ``model`` names the model in messages (the deployment's
    name by default, or as the request spelt it)."""
    return plan_embedding(
        texts,
        options,
        deployment.metadata,
        model=deployment.name if model is None else model,
        truncate_default=deployment.config.truncate,
        encoding_name=encoding_name,
    )


def per_token_plan(
    deployment: Deployment, texts: Sequence[str], options: EmbedOptions
) -> EmbedPlan:
    """The per-token vectors' plan."""
    return token_plan(
        texts,
        options,
        deployment.metadata,
        model=deployment.name,
        truncate_default=deployment.config.truncate,
    )
