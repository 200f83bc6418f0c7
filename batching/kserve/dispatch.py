"""What a KServe v2 infer request runs, whatever its transport: the one dispatch of the HTTP
and the gRPC doors (:func:`answer_infer`).

A request's items (:func:`~.infer.items_of`) go one of four ways, by what the model declares
and what the request asks: a task's parameters on its items (a generating model's run through
its decode loop), the per-token outputs, an embedding plan (pooled vectors with their
options), or the items as they are (a sparse model's ``truncate: false`` refusing an
over-long one). Each way is one data-plane call; the answer is the response's tensors and
parameters, which each door encodes in its own form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from batching.codecs.sparse import refused_length
from batching.models.items import Item
from batching.plane import Caller, DataPlane
from batching.runtime.deployment import Deployment

from .infer import (
    embedding_parameters,
    embedding_plan,
    embedding_tensors,
    output_tensors,
    task_items_of,
    timeout_parameter,
    token_answer_parameters,
    token_answer_tensors,
    token_plan_of,
)
from .tensors import InferRequest, InferTensor

__all__ = ["InferAnswer", "answer_infer"]


@dataclass(frozen=True, slots=True)
class InferAnswer:
    """The response of an infer request: its tensors and its parameters."""

    tensors: list[InferTensor]
    parameters: dict[str, object] = field(default_factory=dict)


async def answer_infer(
    plane: DataPlane,
    deployment: Deployment,
    request: InferRequest,
    items: Sequence[Item],
    caller: Caller,
) -> InferAnswer:
    """Run ``request``'s ``items`` for ``deployment``; the request's ``timeout`` parameter
    lowers ``caller``'s.

    :raises BatchingError: a parameter the model cannot apply, or what the data plane raises
        (refused, failed, past its deadline, the client gone).
    """
    caller = caller.within(timeout_parameter(request.parameters))
    tasked = task_items_of(deployment, request, items)
    if tasked is not None:  # a task's parameters, on its items
        done = await plane.infer(deployment, tasked, caller)
        return InferAnswer(output_tensors(deployment, done.outputs))
    per_token = token_plan_of(deployment, request, items)
    if per_token is not None:
        tokens = await plane.per_token(deployment, per_token, caller)
        return InferAnswer(token_answer_tensors(request, tokens), token_answer_parameters(tokens))
    plan = embedding_plan(deployment, request, items)
    if plan is not None:
        answer = await plane.embed(deployment, plan, caller)
        return InferAnswer(
            embedding_tensors(deployment, plan, answer), embedding_parameters(answer)
        )
    # A sparse model's truncate: false refuses an item over its length.
    limit = refused_length(deployment, request.parameters.get("truncate"))
    done = await plane.infer(deployment, items, caller, max_length=limit)
    return InferAnswer(output_tensors(deployment, done.outputs))
