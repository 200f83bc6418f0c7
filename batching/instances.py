"""Model instances: one model copy on one device, with its own thread (or process).

An instance loads its model, runs its warm-up batches and then runs one batch at a time when
its collector hands it one. Torch never runs on the event loop: every call into the model
happens on the instance's dedicated thread, or in its own process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .batcher import InstanceLost
from .model import Model

__all__ = ["InstanceInfo", "ModelFactory", "ThreadInstance"]

logger = logging.getLogger("batching")

#: Builds a fresh, unloaded model object. Called once per instance (re)start.
ModelFactory = Callable[[], Model]


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """What an instance learned while loading."""

    load_s: float
    warmup_s: float
    warmup_batches: int
    metadata: dict[str, Any]


def load_and_warm(model: Model, device: str, max_batch_size: int) -> InstanceInfo:
    """Load ``model`` on ``device`` and run its warm-up batches; on the instance's thread.

    :raises RuntimeError: when a warm-up batch fails (the instance must not report ready).
    """
    started = time.perf_counter()
    model.load(device)
    loaded = time.perf_counter()
    warmup = getattr(model, "warmup_inputs", None)
    batches: list[list[Any]] = list(warmup(max_batch_size)) if warmup is not None else []
    for batch in batches:
        try:
            outputs = model.predict(batch)
        except Exception as exc:
            raise RuntimeError(f"warm-up batch of {len(batch)} failed: {exc!r}") from exc
        if len(outputs) != len(batch):
            raise RuntimeError(
                f"warm-up batch of {len(batch)} returned {len(outputs)} outputs"
            )
    warmed = time.perf_counter()
    describe = getattr(model, "metadata", None)
    metadata = dict(describe()) if describe is not None else {}
    return InstanceInfo(loaded - started, warmed - loaded, len(batches), metadata)


def predict_timed(model: Model, inputs: list[Any]) -> tuple[Sequence[Any], float]:
    """Run one batch; return the outputs and the seconds the model took."""
    started = time.perf_counter()
    try:
        outputs = model.predict(inputs)
    except Exception:
        raise
    except BaseException as exc:  # noqa: B036
        # SystemExit and friends would end a plain thread; here they mean the instance is
        # gone, which the deployment answers by restarting it.
        raise InstanceLost(f"the instance died: {exc!r}") from exc
    return outputs, time.perf_counter() - started


class ThreadInstance:
    """A model copy driven by one dedicated OS thread.

    torch releases the GIL while it computes, so instances on threads run batches in
    parallel while the event loop keeps serving HTTP.
    """

    kind = "thread"

    def __init__(self, factory: ModelFactory, device: str, name: str) -> None:
        self.device = device
        self.name = name
        self._factory = factory
        self._model: Model | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name
        )

    async def start(self, max_batch_size: int) -> InstanceInfo:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._load, max_batch_size)

    def _load(self, max_batch_size: int) -> InstanceInfo:
        model = self._factory()
        info = load_and_warm(model, self.device, max_batch_size)
        self._model = model
        return info

    async def run(self, inputs: list[Any]) -> tuple[Sequence[Any], float]:
        model = self._model
        if model is None:
            raise InstanceLost("the instance has no loaded model")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, predict_timed, model, inputs)

    def close(self) -> None:
        self._model = None
        self._executor.shutdown(wait=False, cancel_futures=True)
