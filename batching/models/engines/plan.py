"""What serves a loaded model's batches: the chosen variant(s), picked by batch size."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .decision import Decision

__all__ = ["EnginePlan", "Runner"]

#: Runs the model's forward on one encoded batch (the tokenizer's tensors, by name) and
#: returns its first output (last hidden state or logits) as a float32 torch tensor.
Runner = Callable[[Mapping[str, Any]], Any]


class EnginePlan:
    """The decision and the runners it keeps; called like a runner, it hands each batch to
    the variant its size is routed to.

    :param reused: where the decision was read from the cache, if it was.
    """

    def __init__(
        self, decision: Decision, runners: Mapping[str, Runner], reused: str | None = None
    ) -> None:
        missing = [route.name for route in decision.routes if route.name not in runners]
        if missing:
            raise ValueError(f"no runner for {', '.join(missing)}")
        self.decision = decision
        self.reused = reused
        self._runners = [(route.last, runners[route.name]) for route in decision.routes]

    def __call__(self, inputs: Mapping[str, Any]) -> Any:
        size = len(next(iter(inputs.values())))
        for last, runner in self._runners:
            if size <= last:
                return runner(inputs)
        return self._runners[-1][1](inputs)

    def describe(self) -> dict[str, Any]:
        """The choice and the figures behind it, for the model's metadata."""
        return {**self.decision.to_json(), "reused_from_cache": self.reused is not None}
