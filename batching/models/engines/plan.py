"""What serves a loaded model's batches: the chosen variant(s), picked by batch size."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from .decision import Decision
from .governor import ThreadGovernor

__all__ = ["EnginePlan", "Runner"]

#: Runs the model's forward on one encoded batch (the tokenizer's tensors, by name) and
#: returns its first output (last hidden state or logits) as a float32 torch tensor.
Runner = Callable[[Mapping[str, Any]], Any]


class EnginePlan:
    """The decision and the runners it keeps; called like a runner, it hands each batch to
    the variant its size is routed to.

    With :meth:`adapt_threads`, each variant also has a runner per thread count, and a
    :class:`~.governor.ThreadGovernor` picks which one runs each batch from how long the
    batches took: the whole thread budget on quiet cores, fewer beside other work.

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
        #: The runners the routes use (the variants measured and not kept are not held).
        self.runners = {route.name: runners[route.name] for route in decision.routes}
        self._runners = [(route.last, runners[route.name]) for route in decision.routes]
        self._names = [route.name for route in decision.routes]
        self.governor: ThreadGovernor | None = None
        self._threaded: list[Mapping[int, Runner]] = []
        self._clock: Callable[[], float] = time.perf_counter
        self._ran: Callable[[int, float], None] | None = None

    def adapt_threads(
        self,
        governor: ThreadGovernor,
        build: Callable[[str, int], Runner],
        clock: Callable[[], float] = time.perf_counter,
        ran: Callable[[int, float], None] | None = None,
    ) -> None:
        """Give every variant a runner per thread count of ``governor`` (``build(name, n)``)
        and let the governor pick among them per batch, timed with ``clock``; ``ran(threads,
        seconds)`` hears of every batch (the meter of other work the governor asks, which must
        not count the batches' own threads)."""
        self._threaded = [
            {count: build(name, count) for count in governor.choices} for name in self._names
        ]
        self.governor = governor
        self._clock = clock
        self._ran = ran

    def __call__(self, inputs: Mapping[str, Any]) -> Any:
        size = len(next(iter(inputs.values())))
        index = len(self._runners) - 1
        for position, (last, _) in enumerate(self._runners):
            if size <= last:
                index = position
                break
        governor = self.governor
        if governor is None:
            return self._runners[index][1](inputs)
        threads = governor.pick(size)
        runner = self._threaded[index][threads]
        started = self._clock()
        output = runner(inputs)
        seconds = self._clock() - started
        governor.observe(size, _tokens(inputs, size), threads, seconds)
        if self._ran is not None:
            self._ran(threads, seconds)
        return output

    def describe(self) -> dict[str, Any]:
        """The choice and the figures behind it, for the model's metadata."""
        described = {**self.decision.to_json(), "reused_from_cache": self.reused is not None}
        if self.governor is not None:
            described["threads"] = {
                "choices": list(self.governor.choices),
                "by_batch_size": self.governor.describe(),
                "tries_held_back": self.governor.held_back,
            }
        return described


def _tokens(inputs: Mapping[str, Any], size: int) -> int:
    """Items times padded length: what a batch's cost grows with."""
    ids = inputs.get("input_ids")
    shape = getattr(ids, "shape", None)
    if shape is not None and len(shape) == 2:
        return int(shape[0]) * int(shape[1])
    return size
