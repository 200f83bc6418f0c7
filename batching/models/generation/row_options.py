"""What a generated item asks of its row beyond its sampling settings, read from its
parameters: log-probabilities (``logprobs``: how many alternatives per token), a
structured-output constraint (:mod:`.grammars`) and ``echo`` (:mod:`.completion_rule`).
Pure: no torch."""

from __future__ import annotations

from typing import Any

from batching.errors import InvalidRequest

from .completion_rule import CompletionRule
from .grammars import constraint_of, grammar_of

__all__ = ["extras_of"]


def extras_of(
    parameters: dict[str, Any], rule: CompletionRule | None, where: str
) -> dict[str, Any]:
    """The :class:`~.running.Prompt` fields ``parameters`` set: ``logprobs``, ``grammar``
    and ``echo``.

    :raises InvalidRequest: a constraint that does not compile, or more than one.
    """
    logprobs = parameters.get("logprobs")
    try:
        found = constraint_of(parameters)
        grammar = None if found is None else grammar_of(*found)
    except ValueError as exc:
        raise InvalidRequest(f"{where}: {exc}") from None
    return {
        "logprobs": logprobs if isinstance(logprobs, int) else None,
        "grammar": grammar,
        "echo": rule is not None and rule.echo,
    }
