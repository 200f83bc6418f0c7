"""The data plane: the one request path every door calls.

A door parses its wire format (with :mod:`batching.codecs` or :mod:`batching.kserve`),
resolves the model (:meth:`DataPlane.deployment`), makes one data-plane call and formats what
comes back. The calls, one per kind of request:

- :meth:`DataPlane.infer`: items through the model (the batcher; a generating model's decode
  loop, each item's answer gathered);
- :meth:`DataPlane.embed` and :meth:`DataPlane.per_token`: an embedding plan;
- :meth:`DataPlane.generate`: one item's generation, streamed; :meth:`DataPlane.complete`:
  generations gathered, with their usage.

Inside each call, in one order for every door: the deadline (the model's timeout, lowered by
the client's, from the request's arrival), the checks that refuse a request whatever its
tokens, token counting, the refusals of over-long inputs, queueing, the wait for the outputs,
the deadline or the client's departure (:class:`~batching.errors.ClientGone`), and the
count of every refusal. Nothing here knows HTTP: status codes are the doors' business (they
pass the one they answered to :meth:`DataPlane.record`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from batching.codecs.embed_options import EmbedPlan
from batching.codecs.embedding import EmbedAnswer
from batching.codecs.multivector import TokenAnswer
from batching.codecs.sparse import check_lengths
from batching.errors import PayloadTooLarge
from batching.metrics import Metrics
from batching.models.items import Item
from batching.runtime.deployment import Deployment
from batching.tracing.spans import current_span

from . import embedding, generation
from .calls import Call, Caller, Deadline, loop_time
from .counting import TokenCounts, count_tokens
from .deployments import Deployments
from .embedding import TokenLimits
from .generation import Generation
from .queueing import queue_items

__all__ = ["DataPlane", "Inferred"]


@dataclass(frozen=True, slots=True)
class Inferred:
    """What :meth:`DataPlane.infer` got: one output per item, in order, and the tokens the
    model ran (usage) when they were counted."""

    outputs: list[object]
    tokens: int | None = None


class DataPlane:
    """Resolve, deadline, count, submit, wait, record: what every door does with a request.

    :param deployments: the models served.
    :param metrics: where requests are counted and timed.
    """

    def __init__(self, deployments: Deployments, metrics: Metrics) -> None:
        self.deployments = deployments
        self.metrics = metrics

    def deployment(self, name: str | None, version: str | None = None) -> Deployment:
        """See :meth:`Deployments.get`."""
        deployment = self.deployments.get(name, version)
        span = current_span()
        if span is not None:
            span.model(deployment.name)
        return deployment

    @staticmethod
    def now() -> float:
        """The event loop's clock, which deadlines are measured on."""
        return loop_time()

    def call(self, deployment: Deployment, caller: Caller) -> Call:
        """``caller``'s request to ``deployment``, with its deadline."""
        deadline = Deadline.of(deployment, caller.timeout, caller.arrived)
        return Call(deployment, caller, deadline, self.metrics)

    # -- the calls ----------------------------------------------------------------------------

    async def infer(
        self,
        deployment: Deployment,
        items: Sequence[Item],
        caller: Caller,
        *,
        count: bool = False,
        max_length: int | None = None,
    ) -> Inferred:
        """``items`` through the model; a generating model answers each from its whole
        generation.

        :param count: count the items' tokens first (usage; the batcher takes the counts).
        :param max_length: refuse an item over this many tokens (413; a model's limit with
            ``truncate: false``), counted first.
        :raises ClientGone: the client went away first (its items are dropped).
        :raises BatchingError: refused, failed, or past its deadline.
        """
        call = self.call(deployment, caller)
        if deployment.scheduler is not None:
            generation.refuse_logprobs(items)
            done = await generation.complete(call, items)
            return Inferred([answer.answer for answer in done])
        counts = TokenCounts(None, None)
        if count or max_length is not None:
            counts = await count_tokens(
                deployment,
                items,
                limit=None if max_length is None else max_length + 1,
                request_id=caller.request_id,
                admit=lambda: deployment.batcher.admit(len(items), deadline=call.deadline),
            )
        if max_length is not None and counts.lengths is not None:
            try:
                check_lengths(counts.lengths, max_length)
            except PayloadTooLarge:
                # Refused at the edge, as a body over the limit is: the batcher never saw it.
                call.refused("too_large")
                raise
        outputs = await queue_items(call, items, tokens=counts.used)
        return Inferred(outputs, sum(counts.used) if counts.used is not None else None)

    async def embed(
        self,
        deployment: Deployment,
        plan: EmbedPlan,
        caller: Caller,
        limits: TokenLimits | None = None,
    ) -> EmbedAnswer:
        """An embedding plan's pooled vectors (:func:`.embedding.embed`)."""
        return await embedding.embed(self.call(deployment, caller), plan, limits)

    async def per_token(
        self, deployment: Deployment, plan: EmbedPlan, caller: Caller
    ) -> TokenAnswer:
        """A per-token plan's vectors (:func:`.embedding.per_token`)."""
        return await embedding.per_token(self.call(deployment, caller), plan)

    async def generate(self, deployment: Deployment, item: Item, caller: Caller) -> Generation:
        """One item's generation, its first piece there (:func:`.generation.open_stream`)."""
        return await generation.open_stream(self.call(deployment, caller), item)

    async def generate_all(
        self, deployment: Deployment, items: Sequence[Item], caller: Caller
    ) -> list[Generation]:
        """Several items' generations (a request's choices), each with its first piece
        (:func:`.generation.open_streams`)."""
        return await generation.open_streams(self.call(deployment, caller), items)

    async def complete(
        self, deployment: Deployment, items: Sequence[Item], caller: Caller
    ) -> list[Generation]:
        """Every item's whole generation (:func:`.generation.complete`)."""
        return await generation.complete(self.call(deployment, caller), items)

    # -- accounting ---------------------------------------------------------------------------

    def refused(self, model: str, reason: str) -> None:
        """Count one request answered without a result in ``batching_rejected_total``, under
        ``reason`` (the README's table says which reason each status code is counted
        under). ``model`` is "" when the request was refused before its model was known."""
        self.metrics.child(self.metrics.rejected, model, reason).inc()

    def record(self, deployment: Deployment | None, status: int, started: float) -> None:
        """Count one answered request under ``status`` and time it from ``started``;
        ``deployment`` None: answered before its model was known (counted under model "")."""
        name = "" if deployment is None else deployment.name
        if deployment is not None:
            deployment.leases.give_back()
        metrics = self.metrics
        metrics.child(metrics.requests, name, str(status)).inc()
        metrics.child(metrics.request_latency, name).observe(self.now() - started)
