"""An OpenAI completion or chat request as the items its model generates (one per choice):
the task's parameters checked, the OpenAI doors' rule attached
(:mod:`batching.models.generation.completion_rule`: the context-length check,
``truncate_prompt_tokens``, ``echo``), and each choice's seed (choice ``i`` of a seeded
request draws with ``seed + i``, so each is reproducible whatever runs beside it)."""

from __future__ import annotations

from typing import Any

from batching.errors import InvalidRequest
from batching.models.generation.completion_rule import CompletionRule, with_rule
from batching.models.parameters import TaskItem, declared_parameters
from batching.runtime.deployment import Deployment

from .completions import CompletionRequest
from .task_parameters import task_items

__all__ = ["choice_items"]

#: The task whose answer continues its prompt (``echo`` makes sense there only).
_CONTINUES = "text-generation"


def choice_items(deployment: Deployment, request: CompletionRequest) -> list[TaskItem]:
    """``request``'s items, one per choice (``n``).

    :raises InvalidRequest: a parameter the model does not take, or ``echo`` on a model whose
        answer does not continue its input (an encoder-decoder).
    """
    options = request.options
    if options.echo and deployment.metadata.get("task") != _CONTINUES:
        raise InvalidRequest(
            "echo: this model's answer does not continue its input (an encoder-decoder)"
        )
    parameters = dict(request.parameters)
    requested = parameters.get("max_new_tokens")
    over = _over_maximum(deployment, parameters.get("max_new_tokens"))
    if over is not None:
        if deployment.metadata.get("task") != _CONTINUES:
            raise InvalidRequest(f"max_tokens must be at most {over}")
        # The context-length check refuses it, in OpenAI's words.
        parameters["max_new_tokens"] = over
    (item,) = task_items(deployment, [request.input], parameters, where="the request")
    rule = CompletionRule(
        options.truncate_prompt_tokens,
        options.echo,
        "messages" if request.chat else "prompt",
        requested if over is not None and isinstance(requested, int) else None,
    )
    first = with_rule(item, rule)
    seed = first.get("seed")
    items = [first]
    for index in range(1, options.n):
        own = first.parameters
        if seed is not None:
            own = tuple(
                (key, (seed + index) % 2**63 if key == "seed" else value) for key, value in own
            )
        items.append(TaskItem(first.input, own))
    return items


def _over_maximum(deployment: Deployment, asked: Any) -> int | None:
    """The model's most ``max_new_tokens`` when ``asked`` is over it (None: it is not)."""
    declared = declared_parameters(deployment.metadata).get("max_new_tokens")
    if not isinstance(asked, int) or declared is None or declared.maximum is None:
        return None
    return int(declared.maximum) if asked > declared.maximum else None
