"""An embedding request through the data plane, the same on every door: count each text's
tokens (its prompt included) with the model's tokenizer, refuse an over-long text when the
request does not allow cutting it (413), run the items, count the texts the model cut, and
give back the vectors with what the answer reports (which texts were cut, the tokens used).

The wire formats stay the doors' (:mod:`.embed_options` parses the options, each door
encodes the answer); this is the one sequence of data-plane calls they share.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from batching.runtime.deployment import Deployment
from batching.service import DataPlane, TokenCounts

from .embed_options import EmbedPlan, refused_text, too_long, truncated_flags, vectors_of

__all__ = ["EmbedAnswer", "run_embedding"]

#: How far the 413 of ``truncate: false`` counts the refused text, to name its length.
_FULL_COUNT = 1 << 24


@dataclass(frozen=True, slots=True)
class EmbedAnswer:
    """What an embedding request got: one vector per text, in order."""

    vectors: list[np.ndarray]
    #: Per text, whether the model cut it at its maximum length; None when not known.
    truncated: list[bool] | None
    #: Tokens the model ran, prompts included (usage); None when the model cannot count.
    tokens: int | None


async def run_embedding(
    plane: DataPlane,
    deployment: Deployment,
    plan: EmbedPlan,
    *,
    deadline: float,
    request_id: str = "",
    disconnected: Callable[[], Awaitable[None]] | None = None,
    count: bool = False,
    at_least: int = 0,
    check_lengths: Callable[[Sequence[int]], None] | None = None,
) -> EmbedAnswer | None:
    """Run ``plan`` for ``deployment``; None when the client went away first.

    :param count: count tokens even when the model declares no embedding options (for usage).
    :param at_least: count each text's length at least this far (the door's own limits).
    :param check_lengths: the door's own limits, given each text's length before truncation.
    :raises TextTooLong: a text over the model's length, with ``truncate: false``.
    """
    counts = TokenCounts(None, None)
    if plan.described or count or check_lengths is not None:
        counts = await plane.count_tokens(
            deployment,
            list(plan.items),
            limit=plan.token_limit(at_least),
            request_id=request_id,
            deadline=deadline,
        )
    if check_lengths is not None and counts.lengths is not None:
        check_lengths(counts.lengths)
    flags = truncated_flags(plan, counts.lengths)
    refused = refused_text(plan, flags)
    if refused is not None:
        full = await plane.count_tokens(
            deployment, [plan.items[refused]], limit=_FULL_COUNT, request_id=request_id
        )
        length = full.lengths[0] if full.lengths else _FULL_COUNT
        # Refused at the edge, as a body over the limit is: the batcher never saw it.
        plane.refused(deployment.name, "too_large")
        raise too_long(plan, refused, length)
    outputs = await plane.infer(
        deployment,
        list(plan.items),
        deadline=deadline,
        request_id=request_id,
        disconnected=disconnected,
        tokens=counts.used,
    )
    if outputs is None:
        return None
    vectors = vectors_of(outputs, plan, deployment.name)
    cut = sum(flags) if flags else 0
    if cut:
        plane.metrics.truncated.labels(deployment.name).inc(cut)
    tokens = sum(counts.used) if counts.used is not None else None
    return EmbedAnswer(vectors, flags, tokens)
