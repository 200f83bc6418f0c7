"""A deployment: one served model, its batcher, its instances and their supervision."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import cast

from batching.core.batcher import Batcher
from batching.core.events import BatchEvents
from batching.core.jobs import InstanceLost
from batching.core.policy import BatchPolicy, FixedPolicy
from batching.errors import NotReady
from batching.model_config import ModelConfig
from batching.models.engines.cores import CORES
from batching.models.engines.engine_options import ADAPTIVE_THREADS_VARIABLE
from batching.models.items import Item
from batching.models.loading import LOADING, Turn
from batching.models.protocol import ModelHooks, hooks_of, tensors_of
from batching.models.tasks.generation import streams

from .base import Instance, InstanceFactory, ModelFactory
from .batch_host import BatchHost, ThreadHost
from .leases import Leases
from .process import ProcessInstance
from .process_host import GeneratingProcess
from .scheduler import StepScheduler, run_scheduler
from .threads import ThreadInstance
from .warmup import InstanceInfo, WarmupPlan

__all__ = [
    "HEALTHY_PERIOD",
    "RESTART_BACKOFF",
    "Deployment",
    "RestartBackoff",
    "instance_factory_for",
    "make_policy",
]

logger = logging.getLogger("batching")

#: Seconds between restarts of an instance that keeps dying, so a crash loop cannot spin.
RESTART_BACKOFF = (0.0, 1.0, 5.0, 15.0)


#: An instance that served this many seconds before it died was healthy: its restart
#: counts as a first failure again, not as the next step of a crash loop.
HEALTHY_PERIOD = 60.0


class RestartBackoff:
    """How long to wait before restarting an instance that died.

    Deaths in a row walk up :data:`RESTART_BACKOFF`, so a crash loop cannot spin; a death
    after :data:`HEALTHY_PERIOD` seconds of service starts from the first step again, so an
    instance that died once last week does not wait the longest backoff this week.
    """

    def __init__(
        self,
        steps: tuple[float, ...] = RESTART_BACKOFF,
        healthy_period: float = HEALTHY_PERIOD,
    ) -> None:
        self.steps = steps
        self.healthy_period = healthy_period
        self.failures = 0

    def after_death(self, served_from: float, died_at: float) -> float:
        """Seconds to wait before the restart of an instance that served from ``served_from``
        until ``died_at`` (both on one clock)."""
        if died_at - served_from >= self.healthy_period:
            self.failures = 0
        self.failures += 1
        return self.steps[min(self.failures, len(self.steps)) - 1]


def instance_factory_for(config: ModelConfig, index: int) -> InstanceFactory:
    """The default way to build instance ``index`` of ``config``: a thread or a process
    (``config.instance_kind``), told its index and the model's warm-up plan."""
    warmup = WarmupPlan.of(config)
    if config.instance_kind == "process":
        kind = GeneratingProcess if streams(config.model_source.task) else ProcessInstance
        return functools.partial(kind, index=index, warmup=warmup)
    cores = CORES.party(config.name, config.cpu_share)
    fixed = os.environ.get(ADAPTIVE_THREADS_VARIABLE, "1") == "0"

    def thread(factory: ModelFactory, device: str, name: str) -> ThreadInstance:
        # On the CPU, each batch computes on the threads its model's share of this process's
        # cores lends it (batching.models.engines.cores).
        on_cpu = not device.startswith("cuda")
        return ThreadInstance(
            factory,
            device,
            name,
            index=index,
            warmup=warmup,
            cores=cores if on_cpu else None,
            fixed_threads=fixed,
        )

    return thread


async def _arrive(turn: Turn) -> None:
    """Wait for ``turn`` without holding the event loop, nor a thread the interpreter joins
    at exit (a turn behind a load that never returns waits on a daemon thread); cancelled,
    the turn is given up."""
    loop = asyncio.get_running_loop()
    arrived: asyncio.Future[bool] = loop.create_future()

    def settle(came: bool) -> None:
        if not arrived.done():
            arrived.set_result(came)

    def wait() -> None:
        came = turn.wait()
        with contextlib.suppress(RuntimeError):  # the loop closed while it waited
            loop.call_soon_threadsafe(settle, came)

    threading.Thread(target=wait, name=f"turn of {turn.what}", daemon=True).start()
    try:
        await arrived
    except asyncio.CancelledError:
        turn.done()
        raise


async def _opened(opened: asyncio.Event, decoding: asyncio.Task[None]) -> None:
    """Wait until a decode loop has opened its running batch; a loop that ends first
    (its instance could not open one) loses the instance."""
    waiting = asyncio.ensure_future(opened.wait())
    try:
        await asyncio.wait({waiting, decoding}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    if not opened.is_set():
        raise InstanceLost("its decode loop stopped before it opened a running batch")


def make_policy(config: ModelConfig) -> BatchPolicy:
    batching = config.batching
    if batching.policy == "adaptive":
        from batching.core.adaptive import AdaptivePolicy

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
    :param on_ready: called on the event loop each time an instance is loaded and warm.
    :param on_load_failure: called with the reason when an instance cannot load; the
        deployment stays unready (``python server.py`` exits on it).
    :param clock: seconds, for the restart backoff's healthy period.
    """

    def __init__(
        self,
        config: ModelConfig,
        factory: ModelFactory,
        *,
        events: BatchEvents | None = None,
        instance_factory: InstanceFactory | None = None,
        on_ready: Callable[[Deployment, int, InstanceInfo], None] | None = None,
        on_load_failure: Callable[[Deployment, int, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.name = config.name
        self.batcher: Batcher[Item] = Batcher(
            config.name, config.batching, make_policy(config), events
        )
        self.batcher.instances = len(config.devices)
        self.metadata: dict[str, object] = {}
        #: What runs the model (the v2 metadata's ``platform``): what its metadata says once
        #: loaded; until then ``python`` for your own class, ``pytorch`` for the others.
        self.platform = "python" if config.model_source.kind == "class" else "pytorch"
        self.load_error: str | None = None
        #: The class of the exception in :attr:`load_error`: all an answer may say of it
        #: (its text may hold paths; it goes to the log and the start-up error line).
        self.load_error_class: str | None = None
        self.warmup_s: list[float] = []
        #: Resident memory each ready instance's load added, by instance index (bytes).
        self.memory_bytes: dict[int, int] = {}
        self._factory = factory
        self._instance_factory: InstanceFactory | None = instance_factory
        self._on_ready = on_ready
        self._on_load_failure = on_load_failure
        self._clock = clock
        self._tasks: list[asyncio.Task[None]] = []
        #: Counts an input's tokens on the event loop, for token-aware batching.
        self.count_tokens: Callable[[Item], int] | None = None
        self._counting: ModelHooks | None = None
        self._counting_built = asyncio.Lock()
        #: The iteration-level scheduler of a generating model (decoder-only or
        #: encoder-decoder), which every door's generation runs through; None for the others.
        self.scheduler: StepScheduler | None = None
        if streams(config.model_source.task):
            self.scheduler = StepScheduler(
                config.name,
                config.batching.max_batch_size,
                config.batching.max_batch_tokens or None,
                events=self.batcher.events,
            )
        #: The requests that resolved this deployment and have not answered yet.
        self.leases = Leases()

    def _counting_hooks(self, held: bool = False) -> ModelHooks:
        # An unloaded model object of its own: counting needs the tokenizer, not the weights,
        # and must not share the instances' tokenizers, which are busy on their threads.
        hooks = self._counting
        if hooks is None:
            # It builds a model object and its tokenizer, as a load does: in a turn of its
            # own, unless its deployment's load holds one (it is built first thing there).
            with contextlib.nullcontext() if held else LOADING.turn(f"{self.name}'s tokenizer"):
                hooks = hooks_of(self._factory())
                if hooks.count_tokens is not None:
                    hooks.count_tokens("")  # builds its tokenizer here, not on the event loop
            self._counting = hooks
        return hooks

    async def counting_hooks(self) -> ModelHooks:
        """The hooks of the deployment's own model object for counting tokens (never loaded,
        built on a worker thread the first time): ``count_tokens`` and ``token_length`` may
        then be called on the event loop, whether or not the model is batched by tokens."""
        if self._counting is None:
            async with self._counting_built:
                if self._counting is None:
                    await asyncio.to_thread(self._counting_hooks)
        assert self._counting is not None
        return self._counting

    def _token_counter(self) -> Callable[[Item], int] | None:
        counter = self._counting_hooks().count_tokens
        if counter is None:
            logger.warning(
                "model %s has max_batch_tokens set but no count_tokens(); batching by items",
                self.name,
            )
        return counter

    async def tokens_of(self, inputs: Sequence[Item], *, offload: bool = False) -> list[int] | None:
        """Each input's token count, or None when the model is not batched by tokens; on a
        worker thread when ``offload`` or when there are many inputs."""
        counter = self.count_tokens
        if counter is None:
            return None
        if len(inputs) <= 16 and not offload:
            return [counter(item) for item in inputs]
        # Tokenizing a large request would hold up every other request on the loop.
        return await asyncio.to_thread(lambda: [counter(item) for item in inputs])

    @property
    def takes_text(self) -> bool:
        """Whether the model's first input is BYTES (text), as its metadata says."""
        inputs = tensors_of(self.metadata, "inputs")
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
        backoff = RestartBackoff()
        make = self._instance_factory or instance_factory_for(self.config, index)
        while True:
            # One instance of one model loads at a time, in the order asked (the turn is
            # taken before anything is awaited): the libraries' lazy imports race, and N
            # copies loading at once multiply the memory peak (batching.models.loading).
            turn = LOADING.take(f"model {self.name} instance {index}")
            instance = make(self._factory, device, label)
            try:
                try:
                    await _arrive(turn)
                    # Built before the model is ready, so that no request waits for it
                    # behind another model's load.
                    if self._counting is None:
                        await asyncio.to_thread(self._counting_hooks, True)
                    if self.config.batching.max_batch_tokens and self.count_tokens is None:
                        self.count_tokens = await asyncio.to_thread(self._token_counter)
                    started = time.perf_counter()
                    logger.info(
                        "loading model %s on %s (instance %d/%d)...",
                        self.name,
                        device,
                        index + 1,
                        len(self.config.devices),
                    )
                    info = await instance.start(self.config.batching.max_batch_size)
                finally:
                    turn.done()
            except asyncio.CancelledError:
                instance.close()
                raise
            except Exception as exc:
                instance.close()
                self.load_error = f"{type(exc).__name__}: {exc}"
                self.load_error_class = type(exc).__name__
                logger.error("model %s instance %d failed to load: %s", self.name, index, exc)
                if self._on_load_failure is not None:
                    self._on_load_failure(self, index, self.load_error)
                return
            self.metadata = self.metadata or info.metadata
            self.platform = info.platform
            self.warmup_s.append(info.warmup_s)
            self.memory_bytes[index] = info.memory_bytes
            logger.info(
                "model %s instance %d warm in %.1f s, ready on %s (%s): load %.2fs, "
                "warm-up %.2fs (%d batches)",
                self.name,
                index,
                time.perf_counter() - started,
                device,
                instance.kind,
                info.load_s,
                info.warmup_s,
                info.warmup_batches,
            )
            serving_since = self._clock()
            decoding: asyncio.Task[None] | None = None
            host = batch_host_of(instance, self.name)
            opened = asyncio.Event()
            if self.scheduler is not None and host is not None:
                decoding = asyncio.create_task(run_scheduler(self.scheduler, host, opened))
            counted = False
            try:
                if decoding is not None:
                    # A generating instance is ready once its decode loop takes streams:
                    # until then its doors would refuse what the health probe invites.
                    await _opened(opened, decoding)
                # Ready before on_ready is told, so that it sees this instance serving.
                self.batcher.ready_instances += 1
                counted = True
                if self._on_ready is not None:
                    self._on_ready(self, index, info)
                await self._serve(instance, label, decoding)
            except InstanceLost as exc:
                logger.error("model %s instance %d died (%s); restarting", self.name, index, exc)
            finally:
                if counted:
                    self.batcher.ready_instances -= 1
                if decoding is not None:
                    decoding.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await decoding
                instance.close()
            if self.batcher.draining:
                return  # shutting down: nothing to restart for
            await asyncio.sleep(backoff.after_death(serving_since, self._clock()))

    async def _serve(
        self, instance: Instance, label: str, decoding: asyncio.Task[None] | None
    ) -> None:
        """The batcher's collector of ``instance`` until it is lost; a decode loop that
        ends (the place its running batch lived is gone) loses the instance too."""
        if decoding is None:
            await self.batcher.serve(instance.run, label)
            return
        serving = asyncio.ensure_future(self.batcher.serve(instance.run, label))
        try:
            await asyncio.wait({serving, decoding}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not serving.done():
                serving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await serving
        if not serving.cancelled():
            serving.result()  # raises what ended it
        raise InstanceLost("its decode loop stopped")

    async def drain(self, grace: float) -> None:
        """Refuse new requests (503, and not ready) and wait up to ``grace`` seconds for what
        was accepted to be served; the instances keep running."""
        self.batcher.drain()
        if self.scheduler is not None:
            self.scheduler.drain()
        deadline = time.monotonic() + grace
        while (
            not self.batcher.idle or (self.scheduler is not None and not self.scheduler.idle)
        ) and time.monotonic() < deadline:
            if self.batcher.ready_instances == 0:
                break
            await asyncio.sleep(0.01)

    async def stop(self, grace: float) -> None:
        """Refuse new requests, serve what was accepted for up to ``grace`` seconds, then
        fail the rest with 503 and stop the instances."""
        await self.drain(grace)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.batcher.fail_all(NotReady("the server shut down before serving this request"))


def batch_host_of(instance: object, name: str) -> BatchHost | None:
    """Where ``instance``'s running batch lives, if it can hold one: its own host (a
    generating process), or its thread (an instance that runs functions of its model)."""
    own = getattr(instance, "batch_host", None)
    if own is not None:
        return cast("BatchHost", own())
    call = getattr(instance, "call", None)
    return None if call is None else ThreadHost(call, name)
