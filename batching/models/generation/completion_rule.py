"""What the OpenAI doors ask of a generated item beyond the task's parameters (pure data):
OpenAI's context-length rule, vLLM's ``truncate_prompt_tokens``, and ``echo``.

- **Context length.** A prompt of P tokens and a completion of C (``max_tokens``) must fit
  the model's context N (a decoder's positions): P + C > N is a 400 in OpenAI's words,
  "This model's maximum context length is N tokens. However, you requested M tokens (P in
  the messages, C in the completion). ...", instead of the other doors' cut (``truncate``).
  Without ``max_tokens`` (nor a server default), C is what is left of the context, N - P.
  An encoder-decoder's context is its encoder's limit, and its completion is not counted.
- **truncate_prompt_tokens** K: the prompt is first cut to its last K tokens.
- **echo**: the answer starts with the prompt (and its tokens' log-probabilities when
  ``logprobs`` is asked).

A door attaches the rule to an item's parameters under :data:`RULE_KEY` after the declared
parameters are checked (:func:`with_rule`): the other doors cannot send it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batching.errors import InvalidRequest

from ..parameters import TaskItem

__all__ = ["RULE_KEY", "CompletionRule", "fit", "rule_of", "with_rule"]

#: The key an item's parameters carry the rule under.
RULE_KEY = "openai_rule"


@dataclass(frozen=True, slots=True)
class CompletionRule:
    """The OpenAI doors' rule for one item."""

    #: The prompt's last tokens kept (None: the prompt must fit as it is).
    truncate_prompt_tokens: int | None = None
    #: Echo the prompt first (completions).
    echo: bool = False
    #: What the prompt is called in the context-length message.
    prompt_name: str = "prompt"
    #: The request's ``max_tokens`` when over what the model's parameter takes (the
    #: context-length check refuses it in OpenAI's words).
    max_tokens: int | None = None


def with_rule(item: Any, rule: CompletionRule) -> TaskItem:
    """``item`` with ``rule`` among its parameters."""
    if isinstance(item, TaskItem):
        return TaskItem(item.input, tuple(sorted((*item.parameters, (RULE_KEY, rule)))))
    return TaskItem(item, ((RULE_KEY, rule),))


def rule_of(parameters: dict[str, Any]) -> CompletionRule | None:
    """The rule among an item's parameters (None: the item did not come by an OpenAI door)."""
    rule = parameters.get(RULE_KEY)
    return rule if isinstance(rule, CompletionRule) else None


def fit(
    rule: CompletionRule,
    ids: list[int],
    context: int,
    max_tokens: int | None,
    completion_counts: bool,
) -> tuple[list[int], int | None]:
    """``ids`` cut by ``truncate_prompt_tokens`` and checked against ``context``; the
    completion's length (``max_tokens``, or what is left of the context when None and the
    completion counts).

    :raises InvalidRequest: the prompt and completion do not fit, in OpenAI's words.
    """
    if rule.truncate_prompt_tokens is not None and len(ids) > rule.truncate_prompt_tokens:
        ids = ids[len(ids) - rule.truncate_prompt_tokens :]
    prompt = len(ids)
    if not completion_counts:
        if prompt > context:
            raise InvalidRequest(_too_long(context, prompt, prompt, 0, rule.prompt_name))
        return ids, max_tokens
    completion = max_tokens if max_tokens is not None else context - prompt
    if prompt + completion > context or completion < 1:
        wanted = prompt + max(completion, 1)
        raise InvalidRequest(
            _too_long(context, wanted, prompt, max(completion, 1), rule.prompt_name)
        )
    return ids, completion


def _too_long(context: int, wanted: int, prompt: int, completion: int, name: str) -> str:
    return (
        f"This model's maximum context length is {context} tokens. However, you requested "
        f"{wanted} tokens ({prompt} in the {name}, {completion} in the completion). Please "
        f"reduce the length of the {name} or completion."
    )
