"""Busy measurements: marked by the CPU time other processes took while the variants were
timed, and retaken in the background once the server is idle and the machine quiet; idle
buffers given back; a second thread count compiled only when the governor tries it. The
decision code is pure: the measurements, the clock and the machine's load are injected."""

from __future__ import annotations

from typing import Any

import numpy as np

from batching.models.engines.decision import (
    BUSY_CORES,
    Decision,
    Measurement,
    RetakeRule,
    Route,
    decide,
    others_cores,
)
from batching.models.engines.governor import ThreadGovernor
from batching.models.engines.idle import IdleRelease
from batching.models.engines.plan import EnginePlan
from batching.models.engines.remeasure import Retaker


def measured(openvino: float, torch: float) -> list[Measurement]:
    return [
        Measurement("torch", "fp32", {1: torch, 32: torch}),
        Measurement("openvino", "bf16", {1: openvino, 32: openvino}),
    ]


def test_other_processes_cpu_time_during_the_timing_marks_it_busy() -> None:
    # 10 s of timing; the machine was busy 14 s, 9 of them this process's own.
    assert others_cores(machine_busy_s=14.0, own_s=9.0, wall_s=10.0) == 0.5
    assert others_cores(machine_busy_s=9.5, own_s=9.4, wall_s=10.0) < BUSY_CORES
    assert others_cores(1.0, 2.0, 10.0) == 0.0  # rounding between the two clocks
    assert others_cores(1.0, 0.0, 0.0) == 0.0
    busy = Decision((Route("torch", "fp32", 1, 32),), "x", busy_cores=0.5)
    quiet = Decision((Route("torch", "fp32", 1, 32),), "x", busy_cores=0.1)
    assert busy.busy and not quiet.busy
    assert not Decision((Route("torch", "fp32", 1, 32),), "x").busy  # not known: not retaken
    # The mark survives the cache.
    again = Decision.from_json(busy.to_json())
    assert again.busy and again.busy_cores == 0.5
    assert (
        Decision.from_json({k: v for k, v in busy.to_json().items() if k != "busy_cores"}).busy
        is False
    )


def test_a_retake_waits_for_an_idle_server_on_a_quiet_machine_and_backs_off() -> None:
    rule = RetakeRule(first_idle_s=60, idle_s=60, last_idle_s=600)
    assert not rule.due(False, now=1000, last_activity=0, others=0.0)  # quiet measurement
    assert not rule.due(True, now=59, last_activity=0, others=0.0)  # served a batch lately
    assert not rule.due(True, now=1000, last_activity=0, others=1.5)  # others still busy
    assert rule.due(True, now=60, last_activity=0, others=0.0)
    rule.taken(still_busy=True)
    assert not rule.due(True, now=119, last_activity=0, others=0.0)  # twice as long now
    assert rule.due(True, now=120, last_activity=0, others=0.0)
    for _ in range(10):
        rule.taken(still_busy=True)
    assert rule.idle_s == 600


class Runner:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.released = 0

    def __call__(self, inputs: Any) -> np.ndarray:
        self.calls += 1
        return np.full((len(inputs["input_ids"]), 1), float(len(self.name)), np.float32)

    def release_memory(self) -> None:
        self.released += 1


BATCH = {"input_ids": np.ones((2, 4), np.int64)}


def test_the_retaken_choice_is_served_from_the_next_batch() -> None:
    busy = decide(measured(openvino=50, torch=30), 32)
    busy = Decision(busy.routes, busy.reason, busy.measurements, busy_cores=1.7)
    first = Runner("openvino-bf16")
    plan = EnginePlan(busy, {"openvino-bf16": first})
    now = [0.0]
    plan.last_batch_at = 0.0
    # 10 s of CPU from other processes per 10 s of clock until t=100, then none.
    load = {"machine": 0.0}

    def cpu() -> tuple[float, float]:
        return load["machine"], 0.0

    quiet = decide(measured(openvino=40, torch=300), 32)  # torch wins when measured quietly
    quiet = Decision(quiet.routes, quiet.reason, quiet.measurements, busy_cores=0.05)
    second = Runner("torch-fp32")
    retakes: list[float] = []

    def remeasure() -> EnginePlan:
        retakes.append(now[0])
        return EnginePlan(quiet, {"torch-fp32": second})

    retaker = Retaker(plan, remeasure, RetakeRule(60, 60, 600), clock=lambda: now[0], load=cpu)
    for t in range(10, 100, 10):
        now[0] = float(t)
        load["machine"] += 10.0  # one core busy elsewhere
        assert retaker.step() is True
    assert retakes == []  # idle, but the machine stayed busy
    now[0], load["machine"] = 110.0, load["machine"] + 0.1
    assert retaker.step() is False  # retaken: quiet now, nothing left to do
    assert retakes == [110.0]
    assert plan(BATCH)[0, 0] == len("torch-fp32")
    assert second.calls == 1 and first.calls == 0
    assert plan.decision is quiet and plan.describe()["busy"] is False


def busy_plan(busy_cores: float) -> tuple[Decision, Runner, EnginePlan]:
    """A plan whose decision was measured while others used ``busy_cores``, idle since 0."""
    busy = decide(measured(openvino=50, torch=30), 32)
    busy = Decision(busy.routes, busy.reason, busy.measurements, busy_cores=busy_cores)
    runner = Runner("openvino-bf16")
    plan = EnginePlan(busy, {"openvino-bf16": runner})
    plan.last_batch_at = 0.0
    return busy, runner, plan


def test_a_retake_that_keeps_the_choice_keeps_the_runners() -> None:
    busy, runner, plan = busy_plan(1.0)
    same = Decision(busy.routes, "quiet", busy.measurements, busy_cores=0.0)
    retaker = Retaker(
        plan,
        lambda: EnginePlan(same, {"openvino-bf16": Runner("new")}),
        RetakeRule(1, 1, 10),
        clock=lambda: 100.0,
        load=lambda: (0.0, 0.0),
        quiet_s=0.0,
    )
    assert retaker.step() is False
    assert plan.decision is same
    plan(BATCH)
    assert runner.calls == 1


def test_idle_buffers_are_released_once_per_idle_spell_and_never_mid_batch() -> None:
    runner = Runner("openvino-bf16")
    plan = EnginePlan(decide(measured(50, 30), 32), {"openvino-bf16": runner})
    now = [0.0]
    trims: list[float] = []
    keeper = IdleRelease(plan, idle_s=5, clock=lambda: now[0], trim=lambda: trims.append(now[0]))
    plan.last_batch_at = 0.0
    now[0] = 4.0
    keeper.step()
    assert runner.released == 0
    now[0] = 5.0
    keeper.step()
    now[0] = 50.0
    keeper.step()
    assert runner.released == 1 and trims == [5.0]  # once per idle spell
    plan.last_batch_at = 60.0  # a batch ran
    now[0] = 66.0
    with plan.running:  # a batch is running: nothing is released
        keeper.step()
    assert runner.released == 1
    keeper.step()
    assert runner.released == 2 and trims == [5.0, 66.0]


def test_a_retake_waits_until_the_machine_has_been_quiet_for_a_while() -> None:
    busy = decide(measured(openvino=50, torch=30), 32)
    busy = Decision(busy.routes, busy.reason, busy.measurements, busy_cores=1.0, disturbed=True)
    plan = EnginePlan(busy, {"openvino-bf16": Runner("openvino-bf16")})
    plan.last_batch_at = 0.0
    now, machine, retakes = [100.0], [0.0], []

    def remeasure() -> EnginePlan:
        retakes.append(now[0])
        return EnginePlan(Decision(busy.routes, "quiet", disturbed=False), plan.runners)

    retaker = Retaker(
        plan, remeasure, RetakeRule(1, 1, 10), clock=lambda: now[0], load=lambda: (machine[0], 0)
    )
    for t, others in ((105, 5.0), (110, 0.0), (115, 5.0), (120, 0.0), (125, 0.0), (130, 0.0)):
        now[0], machine[0] = float(t), machine[0] + others
        retaker.step()
    # Quiet from 115 on (the window 115-120 was the first quiet one): due 10 s later.
    assert retakes == [125.0]


def test_a_provisional_decision_is_busy_until_measured_and_survives_the_cache() -> None:
    served = Decision((Route("onnxruntime", "fp32", 1, 32),), "at once", provisional=True)
    assert served.busy and Decision.from_json(served.to_json()).provisional
    settled = Decision((Route("openvino", "fp32", 1, 32),), "x", busy_cores=0.9, disturbed=False)
    assert not settled.busy  # disturbed less than its margins allow: kept
    assert "for batches of 1-32" in settled.describe()


def test_every_thread_count_is_built_during_the_load_not_while_serving() -> None:
    built: list[tuple[str, int]] = []
    runner = Runner("openvino-bf16")

    def build(name: str, count: int) -> Runner:
        built.append((name, count))
        return runner if count == 2 else Runner(f"{name}-{count}")

    plan = EnginePlan(decide(measured(50, 30), 32), {"openvino-bf16": runner})
    plan.adapt_threads(ThreadGovernor((2, 1)), build)
    assert built == [("openvino-bf16", 2), ("openvino-bf16", 1)]
    for _ in range(300):  # the governor tries one thread, and comes back: nothing built
        plan(BATCH)
    assert len(built) == 2
    assert plan.lengths.counts == {4: 600}  # 300 batches of 2 items padded to 4 tokens


def test_closing_the_plan_stops_its_threads_and_a_retake_under_way_is_not_swapped_in() -> None:
    busy, runner, plan = busy_plan(1.7)
    now, machine = [1000.0], [0.0]

    def remeasure() -> EnginePlan:
        plan.close()  # the model is unloaded while the child measures
        return EnginePlan(decide(measured(openvino=40, torch=300), 32), {"torch-fp32": runner})

    # The retaker holds the model through ``remeasure`` (a bound method in a real job): it
    # must stop because the plan says so, not because the plan was collected.
    retaker = Retaker(
        plan, remeasure, RetakeRule(1, 1, 10), clock=lambda: now[0], load=lambda: (machine[0], 0)
    )
    retaker.quiet_s = 0.0
    assert retaker.step() is False  # measured, but closed meanwhile: nothing left to do
    assert plan.decision is busy  # the unloaded model's plan kept what it had
    assert retaker.step() is False  # and it never measures again
    served = EnginePlan(busy, {"openvino-bf16": runner})
    threads = [Retaker(served, remeasure).start(), IdleRelease(served).start()]
    served.close()  # the threads poll every few seconds, but stop as soon as it closes
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
