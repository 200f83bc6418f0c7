"""An embedding request's plan for the deployment it goes to, every door's: its texts and
options against the model's metadata, with the server's truncation default
(:func:`~batching.codecs.embed_options.plan_embedding`,
:func:`~batching.codecs.multivector.token_plan`)."""

from __future__ import annotations

from collections.abc import Sequence

from batching.runtime.deployment import Deployment

from .embed_options import EmbedOptions, EmbedPlan, plan_embedding
from .multivector import token_plan

__all__ = ["pooled_plan", "per_token_plan"]


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
