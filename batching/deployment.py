"""A deployment: one served model, its batcher, its instances and their supervision."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from .batcher import Batcher, BatchEvents, InstanceLost, RunBatch
from .config import ModelConfig
from .errors import NotReady
from .instances import InstanceInfo, ModelFactory, instance_factory_for
from .policy import BatchPolicy, FixedPolicy

__all__ = ["Deployment", "Instance"]

logger = logging.getLogger("batching")

#: Seconds between restarts of an instance that keeps dying, so a crash loop cannot spin.
RESTART_BACKOFF = (0.0, 1.0, 5.0, 15.0)


class Instance(Protocol):
    """A model copy on one device: thread-backed or process-backed."""

    kind: str
    device: str

    async def start(self, max_batch_size: int) -> InstanceInfo: ...

    run: RunBatch

    def close(self) -> None: ...


InstanceFactory = Callable[[ModelFactory, str, str], Instance]


def make_policy(config: ModelConfig) -> BatchPolicy:
    batching = config.batching
    if batching.policy == "adaptive":
        from .adaptive import AdaptivePolicy

        return AdaptivePolicy(
            max_queue_delay=batching.max_queue_delay,
            max_latency=batching.max_latency,
            max_batch_size=batching.max_batch_size,
        )
    return FixedPolicy(batching.max_queue_delay)


class Deployment:
    """Serves one model: loads its instances one after another, keeps them running, drains
    them on shutdown.

    :param config: the model's configuration.
    :param factory: builds an unloaded model object; called once per instance start.
    :param events: receives the batcher's counts and timings.
    :param instance_factory: builds instances; by default a thread or a process per
        ``config.instance_kind``, told its index and the warm-up plan.
    """

    def __init__(
        self,
        config: ModelConfig,
        factory: ModelFactory,
        *,
        events: BatchEvents | None = None,
        instance_factory: InstanceFactory | None = None,
        on_ready: Callable[[Deployment, int, InstanceInfo], None] | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.batcher = Batcher(config.name, config.batching, make_policy(config), events)
        self.batcher.instances = len(config.devices)
        self.metadata: dict[str, Any] = {}
        self.load_error: str | None = None
        self.warmup_s: list[float] = []
        self._factory = factory
        self._instance_factory: InstanceFactory | None = instance_factory
        self._on_ready = on_ready
        self._tasks: list[asyncio.Task[None]] = []
        self._loading = asyncio.Lock()
        #: Counts an input's tokens on the event loop, for token-aware batching.
        self.count_tokens: Callable[[Any], int] | None = None

    def _token_counter(self) -> Callable[[Any], int] | None:
        # An unloaded model object of its own: counting needs the tokenizer, not the weights,
        # and must not share the instances' tokenizers, which are busy on their threads.
        counter = getattr(self._factory(), "count_tokens", None)
        if counter is not None:
            counter("")  # builds its tokenizer here, on this thread, not on the event loop
        if counter is None:
            logger.warning(
                "model %s has max_batch_tokens set but no count_tokens(); batching by items",
                self.name,
            )
        return counter

    async def tokens_of(self, inputs: list[Any]) -> list[int] | None:
        """Each input's token count, or None when the model is not batched by tokens."""
        counter = self.count_tokens
        if counter is None:
            return None
        if len(inputs) <= 16:
            return [counter(item) for item in inputs]
        # Tokenizing a large request would hold up every other request on the loop.
        return await asyncio.to_thread(lambda: [counter(item) for item in inputs])

    @property
    def takes_text(self) -> bool:
        """Whether the model's first input is BYTES (text), as its metadata says."""
        inputs = self.metadata.get("inputs") or []
        return bool(inputs) and inputs[0].get("datatype") == "BYTES"

    @property
    def ready(self) -> bool:
        return self.batcher.ready_instances > 0 and not self.batcher.draining

    def start(self) -> None:
        """Start every instance's supervisor; returns at once (loading goes on behind)."""
        for index, device in enumerate(self.config.devices):
            task = asyncio.create_task(self._supervise(index, device), name=f"{self.name}-{index}")
            self._tasks.append(task)

    async def _supervise(self, index: int, device: str) -> None:
        label = f"{self.name}-{index}"
        failures = 0
        make = self._instance_factory or instance_factory_for(self.config, index)
        while True:
            instance = make(self._factory, device, label)
            try:
                # One instance loads at a time: N copies loading at once multiply the
                # memory peak and gain nothing on a machine whose cores the load already uses.
                async with self._loading:
                    if self.config.batching.max_batch_tokens and self.count_tokens is None:
                        self.count_tokens = await asyncio.to_thread(self._token_counter)
                    started = time.perf_counter()
                    info = await instance.start(self.config.batching.max_batch_size)
            except asyncio.CancelledError:
                instance.close()
                raise
            except Exception as exc:
                instance.close()
                self.load_error = f"{type(exc).__name__}: {exc}"
                logger.error("model %s instance %d failed to load: %s", self.name, index, exc)
                return
            self.metadata = self.metadata or info.metadata
            self.warmup_s.append(info.warmup_s)
            logger.info(
                "model %s instance %d ready on %s (%s): load %.2fs, warm-up %.2fs "
                "(%d batches), %.2fs in all",
                self.name,
                index,
                device,
                instance.kind,
                info.load_s,
                info.warmup_s,
                info.warmup_batches,
                time.perf_counter() - started,
            )
            # Everything loaded so far (the model, torch, transformers: millions of objects)
            # lives as long as the process. Left to the cyclic collector, each full
            # collection walks all of it while holding the GIL, stalling the event loop for
            # ~200 ms every few seconds under load (measured). Frozen, it is never walked.
            gc.freeze()
            if self._on_ready is not None:
                self._on_ready(self, index, info)
            self.batcher.ready_instances += 1
            try:
                await self.batcher.serve(instance.run)
            except InstanceLost as exc:
                failures += 1
                logger.error(
                    "model %s instance %d died (%s); restarting", self.name, index, exc
                )
            finally:
                self.batcher.ready_instances -= 1
                instance.close()
            if self.batcher.draining:
                return  # shutting down: nothing to restart for
            await asyncio.sleep(RESTART_BACKOFF[min(failures, len(RESTART_BACKOFF)) - 1])

    async def stop(self, grace: float) -> None:
        """Refuse new requests, serve what was accepted for up to ``grace`` seconds, then
        fail the rest with 503 and stop the instances."""
        self.batcher.drain()
        deadline = time.monotonic() + grace
        while not self.batcher.idle and time.monotonic() < deadline:
            if self.batcher.ready_instances == 0:
                break
            await asyncio.sleep(0.01)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.batcher.fail_all(NotReady("the server shut down before serving this request"))
