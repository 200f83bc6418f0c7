"""Models loaded, reloaded and unloaded while the server serves: Triton's model repository
extension (``POST /v2/repository/models/{name}/load`` and ``.../unload``, the gRPC
``RepositoryModelLoad``/``RepositoryModelUnload``) and ``--model-control-mode poll``.

A reload is a swap with no gap. The new deployment loads and warms beside the one serving;
once every instance of it is warm, :meth:`Deployments.put` makes it the one new requests
resolve, and the old one retires: the requests that resolved it (its leases, see
:mod:`batching.runtime.leases`) are served by it, then it drains and stops. A load that fails
stops only the new deployment: the old one never stopped serving, and the call answers the
error. An unload takes the model out of the collection (new requests get 404), serves what was
accepted, stops the instances and tells the host, which can give the memory back
(:func:`batching.runtime.collector.release_unloaded_objects`).

What the repository holds, and a load call's overrides, are the settings' business: the app
is given :class:`ControlOptions` with two callables, so that nothing here reads a file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batching.config import ModelConfig
from batching.errors import BatchingError, InvalidRequest, LoadFailed, ModelNotFound
from batching.runtime.deployment import Deployment
from batching.runtime.warmup import InstanceInfo
from batching.service import Deployments

__all__ = [
    "MODES",
    "ControlOptions",
    "MakeDeployment",
    "ModelControl",
    "RepositoryEntry",
    "StateCollector",
    "model_states",
]

logger = logging.getLogger("batching")

#: ``--model-control-mode``: none (the models of the start, for good), explicit (load and
#: unload calls), poll (the repository, re-read every ``--repository-poll-secs``).
MODES = ("none", "explicit", "poll")

#: The states the repository index, readiness and ``batching_model_state`` show.
STATES = ("LOADING", "READY", "UNLOADING", "UNAVAILABLE")


@dataclass(frozen=True, slots=True)
class RepositoryEntry:
    """One model the repository holds, as read now."""

    config: ModelConfig
    #: Changes when the model's files change (poll mode reloads the model then).
    stamp: Hashable = None


#: Reads the repository afresh. Raises :class:`InvalidRequest` with a message that names no
#: path of the machine when it cannot be served.
ReadRepository = Callable[[], Sequence[RepositoryEntry]]

#: A model's configuration with a load call's ``config`` applied; raises
#: :class:`InvalidRequest` naming the key at fault.
ApplyOverrides = Callable[[ModelConfig, Mapping[str, Any]], ModelConfig]

OnReady = Callable[[Deployment, int, InstanceInfo], None]
OnFailure = Callable[[Deployment, int, str], None]

#: Builds an unstarted deployment of a configuration, which calls the first callable each
#: time an instance is warm and the second when one cannot load.
MakeDeployment = Callable[[ModelConfig, OnReady, OnFailure], Deployment]


@dataclass(frozen=True, slots=True)
class ControlOptions:
    """What the app needs to change its models at run time."""

    mode: str = "none"
    #: Seconds between two reads of the repository in poll mode.
    poll_seconds: float = 15.0
    #: The repository as it is now; None: only the models of the start can be (re)loaded.
    read_repository: ReadRepository | None = None
    #: Applies a load call's ``config``; None: a load call takes no ``config``.
    apply_overrides: ApplyOverrides | None = None
    #: Called once an unloaded or replaced model is stopped and dropped: the host may then
    #: give its memory back (the garbage collector, ``malloc_trim``).
    on_released: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"model control mode must be one of {', '.join(MODES)}: {self.mode}")
        if self.poll_seconds <= 0:
            raise ValueError(f"the repository poll interval must be > 0 s: {self.poll_seconds}")


class ModelControl:
    """Loads, reloads and unloads the models of ``deployments``.

    :param deployments: the collection the data plane resolves models in.
    :param options: the mode, and how to read the repository.
    :param make: builds a deployment for a configuration.
    :param grace: seconds a retiring deployment's accepted requests may take to finish.
    :param started: the configurations the app started with (what can be reloaded when there
        is no repository to read).
    """

    def __init__(
        self,
        deployments: Deployments,
        options: ControlOptions,
        make: MakeDeployment,
        *,
        grace: float,
        started: Sequence[ModelConfig] = (),
    ) -> None:
        self.deployments = deployments
        self.options = options
        self.mode = options.mode
        self._make = make
        self._grace = grace
        self._started = {config.name: config for config in started}
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._poller: asyncio.Task[None] | None = None
        #: Versions replaced or unloaded that are still finishing what they accepted.
        self._retiring: set[Deployment] = set()
        #: What poll mode last loaded (or failed to load) for each name.
        self._seen: dict[str, tuple[ModelConfig, Hashable]] = {}
        #: The index entry of each name's last failure or unload, until it is loaded again.
        self._last: dict[str, object] = {}

    # -- the calls -----------------------------------------------------------------------

    def check_allowed(self) -> None:
        """Refuse a load or unload call unless the mode is ``explicit``.

        :raises InvalidRequest: naming the mode and the flag.
        """
        if self.mode == "explicit":
            return
        if self.mode == "poll":
            raise InvalidRequest(
                "model control mode is poll (--model-control-mode poll): the server loads "
                "and unloads models as the repository changes, not on request"
            )
        raise InvalidRequest(
            "model control mode is none (--model-control-mode none): the models are loaded "
            "at start only; start the server with --model-control-mode explicit to load and "
            "unload models at run time"
        )

    async def load(self, name: str, overrides: Mapping[str, Any] | None = None) -> None:
        """Load ``name`` from the repository (with ``overrides`` applied), or reload it if it
        is served: the call returns once the new version serves.

        :raises InvalidRequest: the mode forbids it, or the configuration cannot be served.
        :raises ModelNotFound: the repository holds no such model.
        :raises LoadFailed: the model did not load; what served before still serves.
        """
        self.check_allowed()
        config = await self._config_of(name)
        if overrides:
            if self.options.apply_overrides is None:
                raise InvalidRequest("this server takes no config in a load call")
            config = self.options.apply_overrides(config, overrides)
        # Owned here, not by the call: a client that hangs up does not cancel a load halfway.
        await asyncio.shield(self._spawn(self._load_locked(config)))

    async def unload(self, name: str) -> None:
        """Stop serving ``name``: new requests get 404 at once; the call returns once the
        accepted ones are served and the model is stopped and dropped.

        :raises InvalidRequest: the mode forbids it.
        :raises ModelNotFound: ``name`` is not loaded.
        """
        self.check_allowed()
        await asyncio.shield(self._spawn(self._unload_locked(name)))

    # -- poll mode -----------------------------------------------------------------------

    def start(self) -> None:
        """In poll mode, read the repository every ``poll_seconds`` from now on."""
        if self.mode != "poll" or self.options.read_repository is None:
            return
        try:
            entries = self.options.read_repository()
        except InvalidRequest as exc:
            # Changed since the settings read it: the first poll applies what it holds then.
            logger.warning("model repository not applied: %s", exc)
            entries = []
        for entry in entries:
            started = self.deployments.by_name.get(entry.config.name)
            if started is not None and started.config == entry.config:
                self._seen[entry.config.name] = (entry.config, entry.stamp)
        self._poller = asyncio.create_task(self._poll(), name="repository-poll")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.options.poll_seconds)
            try:
                await self.poll_once()
            except Exception:
                logger.exception("reading the model repository failed; nothing changed")

    async def poll_once(self) -> None:
        """Read the repository once: load the models it added, reload those whose
        configuration or files changed, unload those it no longer holds. A repository that
        cannot be read changes nothing (the next poll tries again)."""
        read = self.options.read_repository
        if read is None:
            return
        try:
            entries = await asyncio.to_thread(read)
        except InvalidRequest as exc:
            logger.warning("model repository not applied: %s", exc)
            return
        wanted = {entry.config.name: entry for entry in entries}
        for name, entry in wanted.items():
            seen = (entry.config, entry.stamp)
            if self._seen.get(name) == seen:
                continue  # unchanged since it was loaded, or since its load failed
            self._seen[name] = seen
            try:
                await self._spawn(self._load_locked(entry.config))
            except BatchingError as exc:
                logger.error("poll: model %s not loaded: %s", name, exc)
        for name in [name for name in self.deployments.by_name if name not in wanted]:
            self._seen.pop(name, None)
            with contextlib.suppress(ModelNotFound):
                await self._spawn(self._unload_locked(name))

    # -- shutdown ------------------------------------------------------------------------

    async def close(self, grace: float) -> None:
        """Stop polling, cancel the loads and unloads under way, and stop the versions that
        were retiring within ``grace`` seconds (the app's shutdown stops what is served)."""
        tasks = [*self._tasks, *([self._poller] if self._poller is not None else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        retiring, self._retiring = list(self._retiring), set()
        await asyncio.gather(*(deployment.stop(grace) for deployment in retiring))

    # -- the work ------------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        # Seen here too: the call that awaited it may have gone (a client that hung up).
        if not task.cancelled() and task.exception() is not None:
            logger.debug("model control: %s", task.exception())

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def _config_of(self, name: str) -> ModelConfig:
        read = self.options.read_repository
        if read is None:
            config = self._started.get(name)
        else:
            entries = await asyncio.to_thread(read)
            config = next((e.config for e in entries if e.config.name == name), None)
        if config is None:
            raise ModelNotFound(f"the model repository has no model named {name!r}")
        return config

    def _entry(self, key: object, config: ModelConfig, state: str, reason: str) -> None:
        self.deployments.others[key] = {
            "name": config.name,
            "version": config.version,
            "state": state,
            "reason": reason,
        }

    def _forget_last(self, name: str) -> None:
        key = self._last.pop(name, None)
        if key is not None:
            self.deployments.others.pop(key, None)

    async def _load_locked(self, config: ModelConfig) -> None:
        async with self._lock(config.name):
            await self._load(config)

    async def _load(self, config: ModelConfig) -> None:
        name = config.name
        serving = self.deployments.by_name.get(name)
        key = object()
        reason = (
            "loading"
            if serving is None
            else (
                f"loading beside version {serving.config.version}, which serves until it is ready"
            )
        )
        self._entry(key, config, "LOADING", reason)
        loop = asyncio.get_running_loop()
        warm: asyncio.Future[None] = loop.create_future()
        instances = len(config.devices)
        ready = 0

        def on_ready(deployment: Deployment, index: int, info: InstanceInfo) -> None:
            nonlocal ready
            ready += 1
            if ready >= instances and not warm.done():
                warm.set_result(None)

        def on_failure(deployment: Deployment, index: int, reason: str) -> None:
            if not warm.done():
                warm.set_exception(LoadFailed(deployment.load_error_class or "Exception"))

        logger.info("loading model %s version %s at run time", name, config.version)
        deployment = self._make(config, on_ready, on_failure)
        deployment.start()
        try:
            await warm
        except BaseException as exc:
            self.deployments.others.pop(key, None)
            await deployment.stop(0.0)
            if not isinstance(exc, LoadFailed):
                raise
            failed = str(exc)
            keeps = "" if serving is None else f"; version {serving.config.version} keeps serving"
            self._forget_last(name)
            self._last[name] = key
            self._entry(
                key,
                config,
                "UNAVAILABLE",
                f"failed to load ({failed}; the server log has the details)",
            )
            del deployment
            self._release()
            raise LoadFailed(
                f"model {name!r} version {config.version} failed to load ({failed}; the "
                f"server log has the details){keeps}"
            ) from None
        self.deployments.others.pop(key, None)
        self._forget_last(name)
        replaced = self.deployments.put(deployment)
        logger.info("model %s version %s serves", name, config.version)
        if replaced is not None:
            # Its leaseholders are served by it in the background; new requests are not.
            self._spawn(self._retire(replaced, unloaded=False))

    async def _unload_locked(self, name: str) -> None:
        async with self._lock(name):
            deployment = self.deployments.remove(name)
            if deployment is None:
                raise ModelNotFound(f"model {name!r} is not loaded")
            await self._retire(deployment, unloaded=True)

    async def _retire(self, deployment: Deployment, *, unloaded: bool) -> None:
        """Serve what ``deployment``'s leaseholders asked, then stop it and drop it."""
        config = deployment.config
        key = object()
        self._entry(
            key,
            config,
            "UNLOADING",
            "unloading: serving the requests it accepted"
            if unloaded
            else "replaced: serving the requests it accepted",
        )
        loop = asyncio.get_running_loop()
        until = loop.time() + self._grace
        self._retiring.add(deployment)
        try:
            try:
                async with asyncio.timeout(self._grace):
                    await deployment.leases.wait()
            except TimeoutError:
                logger.warning(
                    "model %s version %s: %d requests still held it after %g s; stopping it",
                    config.name,
                    config.version,
                    len(deployment.leases),
                    self._grace,
                )
            await deployment.stop(max(0.0, until - loop.time()))
            self._retiring.discard(deployment)
        finally:
            self.deployments.others.pop(key, None)
        del deployment
        logger.info(
            "model %s version %s %s",
            config.name,
            config.version,
            "unloaded" if unloaded else "retired",
        )
        if unloaded:
            self._forget_last(config.name)
            self._last[config.name] = key
            self._entry(key, config, "UNAVAILABLE", "unloaded")
        self._release()

    def _release(self) -> None:
        if self.options.on_released is not None:
            self.options.on_released()


def model_states(deployments: Deployments) -> list[dict[str, Any]]:
    """Every model and version the server knows of, with its state and, when it is not
    ready, why: the served ones (READY; LOADING until warm or while an instance restarts;
    UNAVAILABLE when their load failed), then the others (loading beside a served version,
    unloading, unloaded, failed at run time). A ready model also says the resident memory its
    instances' loads added (``memory_mb``)."""
    states: list[dict[str, Any]] = []
    for deployment in deployments:
        entry: dict[str, Any] = {"name": deployment.name, "version": deployment.config.version}
        if deployment.ready:
            entry["state"] = "READY"
            entry["memory_mb"] = round(sum(deployment.memory_bytes.values()) / 2**20, 1)
        elif deployment.load_error_class:
            # Never the load error's text, which may hold paths: its class, and where to look.
            entry["state"] = "UNAVAILABLE"
            entry["reason"] = (
                f"failed to load ({deployment.load_error_class}; the server log has the details)"
            )
        else:
            entry["state"] = "LOADING"
            entry["reason"] = "loading"
        states.append(entry)
    states.extend(dict(entry) for entry in deployments.others.values())
    return states


class StateCollector(Collector):
    """``batching_model_state{model,version,state}``: 1 for each model version in each of its
    states now (a version loading beside its served copy is in two), read at the scrape."""

    def __init__(self, deployments: Deployments) -> None:
        self.deployments = deployments

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "batching_model_state",
            "Models and versions by state (LOADING, READY, UNLOADING, UNAVAILABLE): 1 for each "
            "state a version is in",
            labels=["model", "version", "state"],
        )
        seen: set[tuple[str, str, str]] = set()
        for entry in model_states(self.deployments):
            labels = (entry["name"], entry["version"], entry["state"])
            if labels not in seen:
                seen.add(labels)
                family.add_metric(list(labels), 1.0)
        yield family
