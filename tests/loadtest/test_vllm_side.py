"""The vLLM comparison starts each measurement on idle cores: ``quiet`` waits while the
servers' processes use CPU, and gives up at its limit."""

from __future__ import annotations

import os
from collections.abc import Sequence

from benchmarks.vllm_side import quiet, tree_cpu_seconds


class Machine:
    """A clock that ``sleep`` moves, and processes that use ``busy`` cores until ``until``."""

    def __init__(self, busy: float, until: float) -> None:
        self.now = 0.0
        self.busy = busy
        self.until = until

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def cpu(self, pids: Sequence[int]) -> float:
        assert list(pids) == [7]
        return self.busy * min(self.now, self.until)


def test_it_waits_while_the_servers_compute_and_not_after() -> None:
    machine = Machine(busy=1.0, until=1.2)
    waited = quiet([7], cpu=machine.cpu, sleep=machine.sleep, clock=machine.clock)
    # Windows of 0.5 s: busy in [0, 0.5), [0.5, 1.0) and partly [1.0, 1.5); idle in [1.5, 2.0).
    assert waited == 2.0


def test_an_idle_machine_costs_one_window() -> None:
    machine = Machine(busy=0.0, until=0.0)
    assert quiet([7], cpu=machine.cpu, sleep=machine.sleep, clock=machine.clock) == 0.5


def test_a_machine_that_never_quiets_is_measured_after_the_limit() -> None:
    machine = Machine(busy=1.0, until=1e9)
    waited = quiet([7], limit=3.0, cpu=machine.cpu, sleep=machine.sleep, clock=machine.clock)
    assert 3.0 < waited <= 3.5


def test_the_cpu_of_a_process_tree_counts_this_process() -> None:
    assert tree_cpu_seconds([os.getpid()]) > 0.0
    assert tree_cpu_seconds([2**22 + 12345]) == 0.0  # no such process: nothing counted
