"""An embedding request through the data plane, the same on every door, pooled vectors
(:func:`embed`) or per-token ones (:func:`per_token`): count each text's tokens (its prompt
included) with the model's tokenizer, refuse an over-long text when the request does not allow
cutting it (413), run the items, count the texts the model cut, and give back the vectors with
what the answer reports (which texts were cut, the tokens used).

The wire formats stay the doors' (:mod:`batching.codecs.embed_options` plans the request,
each door encodes the answer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batching.codecs.capability import per_token_cap
from batching.codecs.embed_options import (
    EmbedPlan,
    refused_text,
    too_long,
    truncated_flags,
    vectors_of,
)
from batching.codecs.embedding import EmbedAnswer
from batching.codecs.multivector import TokenAnswer, token_vectors

from .calls import Call
from .counting import TokenCounts, count_tokens
from .queueing import queue_items

__all__ = ["TokenLimits", "embed", "per_token"]

#: How far the 413 of ``truncate: false`` counts the refused text, to name its length.
_FULL_COUNT = 1 << 24


@dataclass(frozen=True, slots=True)
class TokenLimits:
    """A door's own limits on each text's tokens (OpenAI's), beside the model's: every text
    is counted (for usage too), its length at least ``at_least`` far, and ``check`` is given
    each one's length before truncation (it raises for one over the door's limits)."""

    at_least: int
    check: Callable[[Sequence[int]], None]


async def embed(call: Call, plan: EmbedPlan, limits: TokenLimits | None = None) -> EmbedAnswer:
    """Run ``plan``: its pooled vectors; with ``limits``, the door's own limits apply and the
    tokens used are counted whatever the model declares.

    :raises TextTooLong: a text over the model's length, with ``truncate: false``.
    :raises ClientGone: the client went away first.
    """
    counts = TokenCounts(None, None)
    if plan.described or limits is not None:
        at_least = 0 if limits is None else limits.at_least
        counts = await _counted(call, plan, plan.token_limit(at_least))
    if limits is not None and counts.lengths is not None:
        limits.check(counts.lengths)
    flags = await _checked(call, plan, counts)
    outputs = await queue_items(call, list(plan.items), tokens=counts.used)
    vectors = vectors_of(outputs, plan, call.deployment.name)
    _truncated(call, flags)
    tokens = sum(counts.used) if counts.used is not None else None
    return EmbedAnswer(vectors, flags, tokens)


async def per_token(call: Call, plan: EmbedPlan) -> TokenAnswer:
    """Run a per-token ``plan``: each text's token vectors.

    Each text's tokens are counted first: a text over the model's length with
    ``truncate: false`` is refused, and the counts cap the batches the items run in
    (:func:`~batching.codecs.capability.per_token_cap`), since their answer grows with
    their tokens.

    :raises TextTooLong: a text over the model's length, with ``truncate: false``.
    :raises ClientGone: the client went away first.
    """
    counts = await _counted(call, plan, plan.token_limit())
    flags = await _checked(call, plan, counts)
    deployment = call.deployment
    outputs = await queue_items(
        call,
        list(plan.items),
        tokens=counts.used,
        token_cap=per_token_cap(deployment.metadata, deployment.config.batching),
    )
    vectors = token_vectors(outputs)
    _truncated(call, flags)
    return TokenAnswer(vectors, flags, sum(len(output.ids) for output in vectors))


async def _counted(call: Call, plan: EmbedPlan, limit: int | None) -> TokenCounts:
    """The plan's items counted, after the checks that refuse it whatever its tokens."""
    batcher, items = call.deployment.batcher, list(plan.items)
    return await count_tokens(
        call.deployment,
        items,
        limit=limit,
        request_id=call.request_id,
        admit=lambda: batcher.admit(len(items), deadline=call.deadline),
    )


async def _checked(call: Call, plan: EmbedPlan, counts: TokenCounts) -> list[bool] | None:
    """Per text, whether the model will cut it; a text it may not cut is refused.

    :raises TextTooLong: a text over the model's length, with ``truncate: false``.
    """
    flags = truncated_flags(plan, counts.lengths)
    refused = refused_text(plan, flags)
    if refused is None:
        return flags
    full = await count_tokens(
        call.deployment, [plan.items[refused]], limit=_FULL_COUNT, request_id=call.request_id
    )
    # Refused at the edge, as a body over the limit is: the batcher never saw it.
    call.refused("too_large")
    raise too_long(plan, refused, full.lengths[0] if full.lengths else _FULL_COUNT)


def _truncated(call: Call, flags: list[bool] | None) -> None:
    cut = sum(flags) if flags else 0
    if cut:
        call.metrics.child(call.metrics.truncated, call.deployment.name).inc(cut)
