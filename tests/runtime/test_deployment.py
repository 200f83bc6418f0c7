"""Supervision: an instance that dies is restarted, after a backoff that grows while it keeps
dying and starts over once it has served for a healthy period."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from batching import BatchingConfig, ModelConfig
from batching.core.jobs import InstanceLost
from batching.runtime.base import ModelFactory
from batching.runtime.deployment import HEALTHY_PERIOD, RESTART_BACKOFF, Deployment, RestartBackoff
from batching.runtime.warmup import InstanceInfo
from tests.support.fakes import run_virtual
from tests.support.models import EchoModel


@pytest.mark.parametrize(
    ("served", "waits"),
    [
        # (seconds each life lasted before it died) -> the backoff before each restart
        ([0, 0, 0, 0, 0], [0.0, 1.0, 5.0, 15.0, 15.0]),
        ([0, 0, 0, HEALTHY_PERIOD, 0], [0.0, 1.0, 5.0, 0.0, 1.0]),
        ([0, 0, HEALTHY_PERIOD - 1, 0], [0.0, 1.0, 5.0, 15.0]),
        ([7 * 24 * 3600, 0], [0.0, 1.0]),
    ],
)
def test_the_backoff_grows_in_a_crash_loop_and_heals_after_a_healthy_period(
    served: list[float], waits: list[float]
) -> None:
    backoff = RestartBackoff()
    now = 1000.0
    chosen = []
    for seconds in served:
        died_at = now + seconds
        chosen.append(backoff.after_death(now, died_at))
        now = died_at + chosen[-1]
    assert chosen == waits
    assert RESTART_BACKOFF == (0.0, 1.0, 5.0, 15.0)


class _Clock:
    """The deployment's injected clock: the test moves it, nothing else does."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _MortalInstance:
    """An instance whose every batch kills it; records the loop time of each start."""

    kind = "thread"
    device = "cpu"

    def __init__(self, starts: list[float]) -> None:
        self._starts = starts

    async def start(self, max_batch_size: int) -> InstanceInfo:
        self._starts.append(asyncio.get_running_loop().time())
        return InstanceInfo(0.0, 0.0, 0, {})

    async def run(self, inputs: list[Any]) -> tuple[Sequence[Any], float]:
        raise InstanceLost("killed by the test")

    def close(self) -> None:
        return None


def test_a_deployment_restarts_with_backoff_and_heals_by_its_clock() -> None:
    clock = _Clock()
    starts: list[float] = []

    def instance(factory: ModelFactory, device: str, name: str) -> _MortalInstance:
        return _MortalInstance(starts)

    async def main() -> list[float]:
        config = ModelConfig(name="mortal", batching=BatchingConfig(timeout=3600.0))
        ready = asyncio.Event()
        deployment = Deployment(
            config,
            EchoModel,
            instance_factory=instance,
            clock=clock,
            on_ready=lambda *_: ready.set(),
        )
        deployment.start()
        loop = asyncio.get_running_loop()

        async def kill_once(lived: float = 0.0) -> None:
            await ready.wait()  # the restart backoff runs in virtual time before it
            ready.clear()
            clock.now += lived
            future = deployment.batcher.submit(["x"], deadline=loop.time() + 60)
            with pytest.raises(Exception, match="stopped"):
                await future

        for _ in range(4):  # a crash loop: 0, 1, 5 and 15 s before each restart
            await kill_once()
        await kill_once(lived=HEALTHY_PERIOD)  # the fifth life was a healthy one
        await kill_once()
        await ready.wait()
        await deployment.stop(0.0)
        return starts

    starts = run_virtual(main)
    gaps = [round(b - a, 6) for a, b in zip(starts, starts[1:], strict=False)]
    assert len(starts) == 7
    assert gaps == [0, 1, 5, 15, 0, 1], starts


class _GatedHost:
    """A running batch that opens when the test says so."""

    def __init__(self, gate: asyncio.Event) -> None:
        self._gate = gate

    async def open(self) -> tuple[object, int]:
        await self._gate.wait()
        return [], 64


class _GeneratingInstance:
    kind = "thread"
    device = "cpu"

    def __init__(self, gate: asyncio.Event) -> None:
        self._gate = gate

    async def start(self, max_batch_size: int) -> InstanceInfo:
        return InstanceInfo(0.0, 0.0, 0, {})

    def batch_host(self) -> _GatedHost:
        return _GatedHost(self._gate)

    async def run(self, inputs: list[Any]) -> tuple[Sequence[Any], float]:
        await asyncio.Event().wait()  # never answers: this test reads readiness only
        raise AssertionError("unreachable")

    def close(self) -> None:
        return None


def test_a_generating_model_is_ready_only_once_its_decode_loop_takes_streams(
    tmp_path: Path,
) -> None:
    """The health probe must not say ready while the doors would still refuse with 503 "not
    ready"; and the ready announcement (the start-up's "ready" line) still comes, after."""
    gate = asyncio.Event()
    announced: list[bool] = []

    async def main() -> None:
        (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
        config = ModelConfig(name="writer", source=str(tmp_path), task="text-generation")
        deployment = Deployment(
            config,
            EchoModel,
            instance_factory=lambda *_: _GeneratingInstance(gate),
            on_ready=lambda d, *_: announced.append(d.scheduler.instances > 0),
        )
        assert deployment.scheduler is not None
        deployment.start()
        for _ in range(50):  # the instance starts; its decode loop waits on the gate
            await asyncio.sleep(0)
        assert not deployment.ready
        assert announced == []
        gate.set()
        for _ in range(50):
            await asyncio.sleep(0)
        assert deployment.ready
        assert announced == [True]
        await deployment.stop(0.0)

    asyncio.run(main())
