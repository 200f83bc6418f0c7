"""What every instance kind shares: the protocol the deployment drives, the model factory, the
one blocking thread at a lower CPU priority, and a timed call into the model."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from batching.core.jobs import InstanceLost, Outputs
from batching.models.items import Item
from batching.models.protocol import Model

from .warmup import InstanceInfo, Loaded, WarmupPlan
from .worker import InstanceThread

__all__ = [
    "MODEL_NICENESS",
    "Instance",
    "InstanceBase",
    "InstanceFactory",
    "ModelFactory",
    "predict_timed",
    "yield_cpu_to_the_server",
]

logger = logging.getLogger("batching")

#: Builds a fresh, unloaded model object. Called once per instance (re)start; for process
#: instances it is pickled into the child, so it must be picklable.
ModelFactory = Callable[[], Model]


class Instance(Protocol):
    """A model copy on one device: thread-backed or process-backed."""

    kind: str
    device: str

    async def start(self, max_batch_size: int) -> InstanceInfo: ...

    #: Runs one batch: the instance's :data:`~batching.core.jobs.RunBatch`.
    async def run(self, inputs: list[Item]) -> tuple[Outputs, float]: ...

    def close(self) -> None: ...


#: Builds an instance from a model factory, a device and a name (for threads and logs).
InstanceFactory = Callable[[ModelFactory, str, str], Instance]


#: How much lower than the event loop the model's threads run (Linux nice increments).
MODEL_NICENESS = 5


def yield_cpu_to_the_server() -> None:
    """Lower the calling thread's CPU priority below the event loop's.

    On a machine whose cores the model's threads fill, the web layer would otherwise queue
    behind them: under overload the answers that say "no" (503) would take as long as the
    ones that compute. At a lower priority the model gets every cycle the event loop does not
    need. The model's own worker threads are created later by this thread, and inherit it.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), MODEL_NICENESS)
    except (AttributeError, OSError):  # not Linux, or not permitted: run at normal priority
        pass


def predict_timed(model: Model, inputs: list[Item]) -> tuple[Outputs, float]:
    """Run one batch; return the outputs and the seconds the model took."""
    started = time.perf_counter()
    try:
        outputs = model.predict(inputs)
    except Exception:  # the model failed on this input: the batcher bisects the batch
        raise
    except BaseException as exc:  # noqa: B036
        # SystemExit and friends would end a plain thread; here they mean the instance is
        # gone, which the deployment answers by restarting it.
        raise InstanceLost(f"the instance died: {exc!r}") from exc
    return outputs, time.perf_counter() - started


class InstanceBase:
    """What every instance kind holds: its model's factory, device, index and warm-up plan,
    and the one thread that does its blocking work (:class:`~.worker.InstanceThread`, a
    daemon), at a lower CPU priority than the event loop (for a thread instance it computes;
    for a process instance it waits on the pipe)."""

    def __init__(
        self,
        factory: ModelFactory,
        device: str,
        name: str,
        *,
        index: int = 0,
        warmup: WarmupPlan | None = None,
    ) -> None:
        self.device = device
        self.name = name
        self.index = index
        self._factory = factory
        self._warmup = warmup or WarmupPlan()
        # A daemon: a load that never returns does not keep the process alive at exit.
        self._executor = InstanceThread(name, initializer=yield_cpu_to_the_server)
        #: Orders start against close, for kinds whose start creates something to close.
        self._lock = threading.Lock()

    def report_loaded(self, loaded: Loaded) -> None:
        """Log that the model is loaded and the warm-up starts (from the instance's thread)."""
        logger.info(
            "instance %s loaded in %.1f s; warming up (%d batches)...",
            self.name,
            loaded.load_s,
            loaded.warmup_batches,
        )
