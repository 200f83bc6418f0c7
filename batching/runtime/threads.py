"""Thread instances: a model copy driven by one dedicated OS thread of the server process.

Cheap (instances share the interpreter and the imported libraries) and parallel as long as the
model releases the GIL while it computes, as torch does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

from batching.core.jobs import InstanceLost, Outputs
from batching.models.engines.cores import Party
from batching.models.items import Item
from batching.models.protocol import Model, unload_model

from .base import InstanceBase, ModelFactory, predict_timed
from .warmup import InstanceInfo, WarmupPlan, load_and_warm

__all__ = ["ThreadInstance"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class ThreadInstance(InstanceBase):
    """A model copy driven by one dedicated OS thread.

    torch releases the GIL while it computes, so instances on threads run batches in
    parallel while the event loop keeps serving HTTP.
    """

    kind = "thread"

    #: The loaded model; None until :meth:`start` finished, and again once closed.
    _model: Model | None = None

    def __init__(
        self,
        factory: ModelFactory,
        device: str,
        name: str,
        *,
        index: int = 0,
        warmup: WarmupPlan | None = None,
        cores: Party | None = None,
        fixed_threads: bool = False,
    ) -> None:
        """:param cores: the model's handle on the process's cores (:mod:`batching.models.
            cores`): each batch and decode step takes its threads from it. None: the model
            computes on whatever threads it has (a GPU model, or a test's instance).
        :param fixed_threads: the thread count was fixed (``--torch-threads N``): a batch
            waits for all of its threads rather than run on fewer."""
        super().__init__(factory, device, name, index=index, warmup=warmup)
        self._cores = cores
        self._fixed_threads = fixed_threads

    async def start(self, max_batch_size: int) -> InstanceInfo:
        return await self._executor.call_soon(self._load, max_batch_size)

    def _load(self, max_batch_size: int) -> InstanceInfo:
        # In its deployment's turn to load (batching.models.loading): one model at a time.
        model = self._factory()
        try:
            info = load_and_warm(
                model,
                self.device,
                max_batch_size,
                index=self.index,
                warmup=self._warmup,
                on_loaded=self.report_loaded,
            )
        except BaseException:
            unload_model(model)  # what the load started before it failed stops with it
            raise
        self._model = model
        return info

    async def run(self, inputs: list[Item]) -> tuple[Outputs, float]:
        model = self._model
        if model is None:
            raise InstanceLost("the instance has no loaded model")
        return await self._executor.call_soon(self._sharing, predict_timed, model, inputs)

    async def call(self, function: Callable[[Model], T]) -> T:
        """``function(model)`` on the instance's thread (between its batches): how the
        decode loop (:mod:`.scheduler`) steps the model."""
        model = self._model
        if model is None:
            raise InstanceLost("the instance has no loaded model")
        return await self._executor.call_soon(self._sharing, function, model)

    def _sharing(self, function: Callable[[*Ts], T], *args: *Ts) -> T:
        """``function(*args)`` on the threads the model's share of the cores lends it."""
        cores = self._cores
        if cores is None:
            return function(*args)
        wanted = cores.pool.count
        with cores.take(wanted, at_least=wanted if self._fixed_threads else 1):
            return function(*args)

    def close(self) -> None:
        """No batch starts from now on; the model's :meth:`~batching.models.ModelBase.unload`
        runs on the instance's thread after the call running there (a batch, or the load
        itself when the instance closes while it loads)."""
        model, self._model = self._model, None
        self._executor.shutdown(
            wait=False, cancel_futures=True, last=functools.partial(self._unload, model)
        )

    def _unload(self, model: Model | None) -> None:
        # A load that was running when close came has set _model since.
        model, self._model = model or self._model, None
        if model is not None:
            unload_model(model)
