"""What serves a loaded model's batches: the chosen variant(s), picked by batch size."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .cores import CORES
from .decision import Decision
from .governor import ThreadGovernor
from .lengths import TrafficLengths

__all__ = ["EnginePlan", "Runner"]

#: Runs the model's forward on one encoded batch (the tokenizer's tensors, by name) and
#: returns its first output (last hidden state or logits) as a float32 torch tensor.
Runner = Callable[[Mapping[str, Any]], Any]


class EnginePlan:
    """The decision and the runners it keeps; called like a runner, it hands each batch to
    the variant its size is routed to.

    With :meth:`adapt_threads`, each variant also has a runner per thread count, and a
    :class:`~.governor.ThreadGovernor` picks which one runs each batch from how long the
    batches took: the whole thread budget on quiet cores, fewer beside other work. Every
    count's runner is built by :meth:`adapt_threads`, during the load: nothing is compiled
    while the server serves (the engines share the weights between them where they can).

    :meth:`replace` swaps in another decision and its runners (a retaken measurement) between
    two batches.

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
        self._threaded: list[dict[int, Runner]] = []
        self._build: Callable[[str, int], Runner] | None = None
        self._clock: Callable[[], float] = time.perf_counter
        self._ran: Callable[[int, float], None] | None = None
        #: When the last batch ran (``time.monotonic``): how long the server has been idle.
        self.last_batch_at = time.monotonic()
        self._swap = threading.Lock()
        #: Held while a batch runs: buffers are released (:meth:`release_memory`) only
        #: between batches.
        self.running = threading.Lock()
        #: What the cache keeps beside the decision (when it was measured, the tokenizer check).
        self.notes: dict[str, Any] = {}
        #: The engine cache's folder of this model (None: torch alone, no cache).
        self.cache_folder: Path | None = None
        #: The padded lengths of the batches served (the next measurement times at them).
        self.lengths = TrafficLengths()
        #: Set by :meth:`close`: the plan's background threads (idle release, retake) stop.
        self.closed = threading.Event()

    def close(self) -> None:
        """The model is unloaded: its background threads stop at their next look (a retake
        already measuring finishes, and is not swapped in)."""
        self.closed.set()

    def replace(self, other: EnginePlan) -> None:
        """Serve with ``other``'s decision and runners from the next batch on (its thread
        governor too, if it has one)."""
        with self._swap:
            self._replace(other)

    def _replace(self, other: EnginePlan) -> None:
        self.decision = other.decision
        self.reused = other.reused
        self.runners = other.runners
        self.governor, self._threaded, self._build = other.governor, other._threaded, other._build
        self._names = other._names
        self._runners = other._runners
        self._ran = other._ran

    def adapt_threads(
        self,
        governor: ThreadGovernor,
        build: Callable[[str, int], Runner],
        clock: Callable[[], float] = time.perf_counter,
        ran: Callable[[int, float], None] | None = None,
    ) -> None:
        """Give every variant a runner per thread count of ``governor`` (``build(name, n)``,
        all now) and let the governor pick among them per batch, timed with ``clock``;
        ``ran(threads, seconds)`` hears of every batch (the meter of other work the governor
        asks, which must not count the batches' own threads)."""
        self._threaded = [
            {count: build(name, count) for count in governor.choices} for name in self._names
        ]
        self._build = build
        self.governor = governor
        self._clock = clock
        self._ran = ran

    def _threaded_runner(self, index: int, threads: int) -> Runner:
        runners = self._threaded[index]
        runner = runners.get(threads)
        if runner is None:
            assert self._build is not None
            runner = runners[threads] = self._build(self._names[index], threads)
        return runner

    def __call__(self, inputs: Mapping[str, Any]) -> Any:
        size = len(next(iter(inputs.values())))
        with self._swap:  # a retake may swap the runners in between two batches
            routes = self._runners
            index = len(routes) - 1
            for position, (last, _) in enumerate(routes):
                if size <= last:
                    index = position
                    break
            governor = self.governor
            if governor is not None:
                threads = governor.pick(size, CORES.granted())
                runner = self._threaded_runner(index, threads)
        with self.running:
            try:
                if governor is None:
                    self.lengths.add(size, _tokens(inputs, size) // max(size, 1))
                    return routes[index][1](inputs)
                started = self._clock()
                output = runner(inputs)
                seconds = self._clock() - started
                tokens = _tokens(inputs, size)
                governor.observe(size, tokens, threads, seconds)
                self.lengths.add(size, tokens // max(size, 1))
                if self._ran is not None:
                    self._ran(threads, seconds)
                return output
            finally:
                self.last_batch_at = time.monotonic()

    def release_memory(self) -> bool:
        """Let every runner that can give back the buffers its batches left (unless a batch
        is running: then nothing, and False)."""
        if not self.running.acquire(blocking=False):
            return False
        try:
            with self._swap:
                runners = [runner for _, runner in self._runners]
                runners += [runner for counts in self._threaded for runner in counts.values()]
            for runner in {id(runner): runner for runner in runners}.values():
                release = getattr(runner, "release_memory", None)
                if release is not None:
                    release()
            return True
        finally:
            self.running.release()

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
