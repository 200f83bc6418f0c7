"""The thread governor: which thread count each batch runs on, from injected batch times."""

from __future__ import annotations

import pytest

from batching.models.engines.governor import (
    FIRST_INTERVAL,
    GAP_PER_COST,
    LAST_INTERVAL,
    ThreadGovernor,
    thread_choices,
)

TOKENS = 32 * 12


def run(
    governor: ThreadGovernor, batches: int, cost: dict[int, float], items: int = 32
) -> list[int]:
    """``batches`` batches whose seconds per token on each thread count are ``cost``."""
    picked = []
    for _ in range(batches):
        threads = governor.pick(items)
        picked.append(threads)
        governor.observe(items, TOKENS, threads, cost[threads] * TOKENS)
    return picked


def test_choices_are_the_budget_half_of_it_and_one() -> None:
    assert thread_choices(2) == (2, 1)
    assert thread_choices(8) == (8, 4, 1)
    assert thread_choices(1) == (1,)


def test_one_choice_is_never_tried_against_anything() -> None:
    governor = ThreadGovernor((1,))
    assert set(run(governor, 50, {1: 1.0})) == {1}


def test_quiet_cores_keep_the_whole_team_and_tries_grow_rare() -> None:
    governor = ThreadGovernor((2, 1))
    picked = run(governor, 2000, {2: 1.0, 1: 1.7})
    assert governor.current(32) == 2
    tries = picked.count(1)
    # Each failed try doubles the gap up to LAST_INTERVAL: a few dozen tries in 2,000 batches.
    assert tries <= 2000 // LAST_INTERVAL + 8
    assert picked[-LAST_INTERVAL:].count(1) <= 1


def test_a_competing_process_moves_batches_to_one_thread_within_a_gap() -> None:
    governor = ThreadGovernor((2, 1))
    run(governor, 3000, {2: 1.0, 1: 1.7})  # quiet: the gap between tries is at its longest
    picked = run(governor, 10, {2: 17.0, 1: 1.8})  # now one core is taken
    # The dearer current choice triggers a try at once, not after the long gap.
    assert picked[-1] == 1 and governor.current(32) == 1


def test_when_the_competitor_leaves_the_team_comes_back() -> None:
    governor = ThreadGovernor((2, 1))
    run(governor, 200, {2: 17.0, 1: 1.8})
    assert governor.current(32) == 1
    picked = run(governor, LAST_INTERVAL + 2, {2: 1.0, 1: 1.7})
    assert governor.current(32) == 2
    assert picked[-1] == 2


def test_sizes_are_judged_apart() -> None:
    governor = ThreadGovernor((2, 1))
    run(governor, 100, {2: 1.0, 1: 1.7}, items=32)
    run(governor, 100, {2: 3.0, 1: 1.0}, items=1)
    assert governor.current(32) == 2 and governor.current(1) == 1
    described = governor.describe()
    assert described["<=1"]["threads"] == 1 and described["<=63"]["threads"] == 2


def test_a_slow_first_batch_does_not_stick() -> None:
    governor = ThreadGovernor((2, 1))
    # The first call pays for lazy initialisation: ten times its real cost.
    governor.observe(32, TOKENS, governor.pick(32), 10.0 * TOKENS)
    picked = run(governor, 4 * FIRST_INTERVAL + 40, {2: 1.0, 1: 1.7})
    assert governor.current(32) == 2 and picked[-1] == 2


def test_bad_choices_are_refused() -> None:
    with pytest.raises(ValueError):
        ThreadGovernor(())
    with pytest.raises(ValueError):
        ThreadGovernor((2, 0))


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_plan_runs_each_batch_on_the_threads_its_governor_picks() -> None:
    from batching.models.engines.decision import Decision, Route
    from batching.models.engines.plan import EnginePlan

    clock = FakeClock()
    per_token = {2: 1.0, 1: 1.7}  # quiet cores
    ran: list[int] = []

    def build(name: str, count: int) -> object:
        def run(inputs: dict[str, object]) -> str:
            ran.append(count)
            clock.now += per_token[count] * 32 * 12
            return f"{name} on {count}"

        return run

    route = Route("torch", "fp32", 1, 32)
    plan = EnginePlan(Decision((route,), "test"), {route.name: lambda inputs: "unused"})
    plan.adapt_threads(ThreadGovernor((2, 1)), build, clock)  # type: ignore[arg-type]

    class Ids:
        shape = (32, 12)

        def __len__(self) -> int:
            return 32

    batch = {"input_ids": Ids(), "attention_mask": Ids()}
    for _ in range(300):
        assert plan(batch).endswith(f"on {ran[-1]}")
    assert ran[-50:].count(2) >= 49
    per_token.update({2: 17.0, 1: 1.8})  # a competitor arrives
    for _ in range(20):
        plan(batch)
    assert ran[-5:] == [1] * 5
    assert plan.describe()["threads"]["by_batch_size"]["<=63"]["threads"] == 1


def test_a_dear_try_waits_in_proportion_to_its_cost() -> None:
    governor = ThreadGovernor((2, 1))
    run(governor, 20, {2: 10.0, 1: 1.0})  # beside a competitor: two threads cost 10x
    assert governor.current(32) == 1
    picked = run(governor, 1000, {2: 10.0, 1: 1.0})
    tries = picked.count(2)
    # Each try costs ten batches: at most about one in GAP_PER_COST of the time goes to them.
    assert tries * 10 <= 1000 * 10 // GAP_PER_COST + 10


def test_one_dear_batch_is_enough_to_try_another_count() -> None:
    governor = ThreadGovernor((2, 1))
    run(governor, 3000, {2: 1.0, 1: 1.7})
    picked = run(governor, 2, {2: 17.0, 1: 1.8})
    assert picked == [2, 1]  # the very next batch tries one thread


def test_batches_that_vary_in_cost_bring_no_try_forward() -> None:
    """Prompts of different lengths in one size bucket cost 0.8 or 2.0 per token on the
    whole team, 1.7 on one thread: the team is cheaper on average, and a dear batch among
    cheap ones is not a competitor (the smoothed cost decides, not one batch)."""
    governor = ThreadGovernor((2, 1))
    run(governor, 600, {2: 1.0, 1: 1.7})  # settled: tries are at their longest gap
    picked = []
    for index in range(LAST_INTERVAL):
        threads = governor.pick(32)
        picked.append(threads)
        cost = {2: 0.8 if index % 2 else 2.0, 1: 1.7}[threads]
        governor.observe(32, TOKENS, threads, cost * TOKENS)
    assert governor.current(32) == 2
    assert picked.count(1) <= 1  # at most the one try the gap allows


def test_a_new_size_starts_on_the_count_the_nearest_size_runs() -> None:
    governor = ThreadGovernor((2, 1))
    run(governor, 50, {2: 10.0, 1: 1.0}, items=32)
    assert governor.current(32) == 1
    assert governor.pick(20) == 1


class Machine:
    """Other work, in cores, as the governor's meter reports it (set by the test)."""

    def __init__(self) -> None:
        self.others: float | None = 0.0
        self.asked = 0

    def read(self) -> float | None:
        self.asked += 1
        return self.others


def test_a_larger_team_is_not_tried_while_other_work_holds_its_cores() -> None:
    machine = Machine()
    governor = ThreadGovernor((2, 1), machine.read)
    # Quiet first: two threads win, and one thread's cost is known from the tries.
    quiet = {2: 0.5, 1: 1.0}
    assert run(governor, 100, quiet)[-1] == 2
    # A storm: the event loop holds a core, two threads cost ten times one thread.
    storm = {2: 10.0, 1: 1.0}
    machine.others = 1.0
    picked = run(governor, 600, storm)
    # The first batch of the storm still runs on two threads and shows it; one thread is
    # tried at once and kept, and no two-thread try runs while the storm lasts.
    assert picked[0] == 2
    assert picked[1:] == [1] * 599
    assert governor.held_back > 0
    assert machine.asked > 0
    # The storm ends: the next due try runs and two threads win back.
    machine.others = 0.1
    picked = run(governor, 2 * LAST_INTERVAL, quiet)
    assert picked[-1] == 2


def test_without_a_meter_tries_continue_as_before() -> None:
    governor = ThreadGovernor((2, 1))
    run(governor, 100, {2: 0.5, 1: 1.0})
    picked = run(governor, 600, {2: 10.0, 1: 1.0})
    assert picked[1:].count(2) >= 2
    assert governor.held_back == 0


def test_fewer_threads_are_tried_whatever_other_work_does() -> None:
    machine = Machine()
    machine.others = 1.5
    governor = ThreadGovernor((2, 1), machine.read)
    picked = run(governor, FIRST_INTERVAL + 2, {2: 1.0, 1: 0.5})
    assert 1 in picked
    assert governor.current(32) == 1


def test_an_unmeasured_machine_does_not_hold_tries_back() -> None:
    machine = Machine()
    machine.others = None
    governor = ThreadGovernor((2, 1), machine.read)
    run(governor, 100, {2: 0.5, 1: 1.0})
    picked = run(governor, 600, {2: 10.0, 1: 1.0})
    assert picked[1:].count(2) >= 2


def test_a_batch_runs_on_no_more_threads_than_it_was_lent() -> None:
    from batching.models.engines.cores import Cores
    from batching.models.engines.decision import Decision, Route
    from batching.models.engines.plan import EnginePlan

    ran: list[int] = []

    def build(name: str, count: int) -> object:
        return lambda inputs: ran.append(count)

    route = Route("torch", "fp32", 1, 32)
    plan = EnginePlan(Decision((route,), "test"), {route.name: lambda inputs: "unused"})
    plan.adapt_threads(ThreadGovernor((2, 1)), build)  # type: ignore[arg-type]
    batch = {"input_ids": [[1, 2]], "attention_mask": [[1, 1]]}
    pool = Cores(2)
    pool.on_grant = lambda count: None
    busy, other = pool.party("busy"), pool.party("other")
    plan(batch)
    assert ran == [2]  # no pool: the governor's choice
    import batching.models.engines.plan as plan_module

    saved = plan_module.CORES
    plan_module.CORES = pool
    try:
        with other.take(2):
            pass
        with pool.take(busy, 2) as granted:  # the other model was busy just now: one core
            assert granted == 1
            plan(batch)
    finally:
        plan_module.CORES = saved
    assert ran == [2, 1]
    assert ThreadGovernor((8, 4, 1)).pick(4, at_most=5) == 4
    assert ThreadGovernor((8, 4, 1)).pick(4, at_most=3) == 1
