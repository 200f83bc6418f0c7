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

Who may call: the doors hand :meth:`ModelControl.authorize` the key the call presents, and
the server's keys (:class:`batching.keys.AccessKeys`) say whether it may load and unload. A
load's instances must fit the instance budget beside the other models' (those served and those
loading), checked before anything starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Hashable, Mapping, Sequence
from typing import Any

from batching.errors import (
    BatchingError,
    InvalidRequest,
    LoadFailed,
    ModelNotFound,
    PermissionDenied,
)
from batching.keys import AccessKeys
from batching.model_config import ModelConfig
from batching.plane import Deployments
from batching.runtime.cpus import InstanceBudget
from batching.runtime.deployment import Deployment
from batching.runtime.warmup import InstanceInfo

from .control_options import ControlOptions, MakeDeployment

__all__ = ["ModelControl"]

logger = logging.getLogger("batching")


class ModelControl:
    """Loads, reloads and unloads the models of ``deployments``.

    :param deployments: the collection the data plane resolves models in.
    :param options: the mode, and how to read the repository.
    :param make: builds a deployment for a configuration.
    :param grace: seconds a retiring deployment's accepted requests may take to finish.
    :param started: the configurations the app started with (what can be reloaded when there
        is no repository to read).
    :param keys: the server's keys, which say who may load and unload; none: everyone may
        (a server without keys).
    """

    def __init__(
        self,
        deployments: Deployments,
        options: ControlOptions,
        make: MakeDeployment,
        *,
        grace: float,
        started: Sequence[ModelConfig] = (),
        keys: AccessKeys | None = None,
    ) -> None:
        self.deployments = deployments
        self.keys = keys if keys is not None else AccessKeys()
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
        #: The loads under way (accepted, not yet served or failed): their name and instances.
        self._claims: dict[object, tuple[str, int]] = {}

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

    def authorize(self, credential: str | None) -> None:
        """Refuse a load or unload call the mode forbids, or whose caller may not make it.

        :param credential: the key the call presents, if any.
        :raises InvalidRequest: the mode is not ``explicit`` (:meth:`check_allowed`).
        :raises PermissionDenied: the key is not an admin key (or the server has none).
        """
        self.check_allowed()
        refusal = self.keys.control_refusal(credential)
        if refusal is not None:
            raise PermissionDenied(refusal)

    async def load(self, name: str, overrides: Mapping[str, object] | None = None) -> None:
        """Load ``name`` from the repository (with ``overrides`` applied), or reload it if it
        is served: the call returns once the new version serves.

        :raises InvalidRequest: the mode forbids it, or the configuration cannot be served
            (its instances do not fit beside the other models' included), before anything
            is started.
        :raises ModelNotFound: the repository holds no such model.
        :raises LoadFailed: the model did not load; what served before still serves.
        """
        self.check_allowed()
        config = await self._config_of(name)
        room = self._room_beside(name)
        if overrides:
            if self.options.apply_overrides is None:
                raise InvalidRequest("this server takes no config in a load call")
            config = self.options.apply_overrides(config, overrides, room)
        try:
            room.check(len(config.devices))
        except ValueError as exc:
            where = "config: instance_group" if overrides else "instance_group"
            raise InvalidRequest(
                f"{where}: model {name!r} asks for {len(config.devices)} instances: {exc}"
            ) from None
        # Claimed now, before anything awaits, so that a load beside it counts these; given
        # back when the load is done, however it ends.
        claim = object()
        self._claims[claim] = (name, len(config.devices))
        # Owned here, not by the call: a client that hangs up does not cancel a load halfway.
        task = self._spawn(self._load_locked(config))
        task.add_done_callback(lambda _: self._claims.pop(claim, None))
        await asyncio.shield(task)

    def _room_beside(self, name: str) -> InstanceBudget:
        """The instance budget with what the other models take: those served and those
        loading (the version ``name`` replaces goes once the new one serves)."""
        used = sum(len(d.config.devices) for d in self.deployments if d.name != name)
        used += sum(count for other, count in self._claims.values() if other != name)
        return self.options.instances.beside(used)

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
        """In poll mode, read the repository every ``poll_seconds`` from now on. In explicit
        mode, say who may load and unload when it is everyone or no one."""
        if self.mode == "explicit":
            warning = self.keys.control_warning()
            if warning is not None:
                logger.warning("model control: %s", warning)
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
