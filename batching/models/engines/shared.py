"""Runners shared between copies of one model in a process.

Two instances of a model (``instance_group.count``), or two names for the same folder with
other settings (prompts, truncation, batching), run the same weights: each building its own
compiled engine would cost the weights again for nothing, and a second copy of the packaged
model would cost more than the first (the compiled graph, and a second for another thread
count). So a runner built from the engine cache (not a measurement's) is kept here under what
it was built from (the model's cache folder, engine, precision, threads and device) while any
plan uses it, and a copy that asks for the same one gets it. Every runner may be called from
several instance threads at once: torch in inference mode and ONNX Runtime's session are safe
so; OpenVINO's runner keeps one infer request per calling thread.

Held weakly: once no plan serves with a runner (its models unloaded), it is freed.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable

from .plan import Runner

__all__ = ["shared_runner"]

_RUNNERS: weakref.WeakValueDictionary[Hashable, Runner] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def shared_runner(key: Hashable, build: Callable[[], Runner]) -> Runner:
    """The runner kept under ``key``, built with ``build`` when there is none."""
    with _LOCK:
        runner = _RUNNERS.get(key)
        if runner is None:
            runner = build()
            _RUNNERS[key] = runner
        return runner
