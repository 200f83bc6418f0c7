"""AdaptivePolicy: table-driven decisions, estimator fits, bound properties and a simulation.

Everything runs on synthetic timestamps; nothing reads a clock or sleeps. The simulation
drives the real batcher on a virtual-time event loop (``tests/support/sim.py``).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batching.core.adaptive import AdaptivePolicy
from batching.core.policy import FixedPolicy, Formation
from tests.support.sim import SimResult, linear_cost, simulate

A = 0.005
B = 0.0017
CAP = 0.005
BUDGET = 0.1
MAX_BATCH = 32
T0 = 100.0


def make_policy(**overrides: Any) -> AdaptivePolicy:
    kwargs: dict[str, Any] = {
        "max_queue_delay": CAP,
        "max_latency": BUDGET,
        "max_batch_size": MAX_BATCH,
        "prior_fixed_s": A,
        "prior_per_item_s": B,
    }
    kwargs.update(overrides)
    return AdaptivePolicy(**kwargs)


def formation(**overrides: Any) -> Formation:
    base = Formation(
        now=T0,
        oldest_enqueued_at=T0,
        batch_items=1,
        batch_tokens=0,
        max_batch_size=MAX_BATCH,
        backlog=True,
        busy_instances=0,
        instances=1,
    )
    return replace(base, **overrides)


def feed_rate(
    policy: AdaptivePolicy, rate: float, *, seconds: float = 1.0, end: float = T0
) -> None:
    """Evenly spaced single-item arrivals at ``rate`` items/s for ``seconds``, ending at ``end``."""
    count = max(1, int(rate * seconds))
    gap = seconds / count
    for i in range(count):
        policy.observe_arrival(end - (count - 1 - i) * gap, 1)


def feed_costs(
    policy: AdaptivePolicy, fixed_s: float, per_item_s: float, batches: int = 200
) -> None:
    for i in range(batches):
        n = 1 + (i * 7) % MAX_BATCH
        policy.observe_batch(n, 0, fixed_s + per_item_s * n)


# Construction ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_queue_delay": -0.001}, "max_queue_delay"),
        ({"max_queue_delay": math.inf}, "max_queue_delay"),
        ({"max_queue_delay": math.nan}, "max_queue_delay"),
        ({"max_latency": 0.0}, "max_latency"),
        ({"max_latency": math.nan}, "max_latency"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"prior_fixed_s": -1.0}, "prior_fixed_s"),
        ({"prior_per_item_s": math.inf}, "prior_per_item_s"),
        ({"rate_window_s": 0.0}, "rate_window_s"),
        ({"cost_memory_batches": 0}, "cost_memory_batches"),
        ({"outlier_threshold": 0.0}, "outlier_threshold"),
    ],
)
def test_rejects_bad_arguments(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_policy(**overrides)


def test_starts_from_priors() -> None:
    policy = make_policy(max_latency=math.inf)
    assert policy.arrival_rate == 0.0
    assert policy.cost_fixed_s == A
    assert policy.cost_per_item_s == B
    assert policy.predicted_cost(10) == pytest.approx(A + 10 * B)


# Decisions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "rate", "overrides", "policy_overrides"),
    [
        ("nothing observed yet", 0.0, {}, {}),
        ("light traffic", 20.0, {}, {}),
        ("medium traffic, batch already at n*", 300.0, {"batch_items": 4}, {}),
        ("lone client: no backlog, nothing busy", 500.0, {"backlog": False}, {}),
        ("idle peer instance", 500.0, {"instances": 2, "busy_instances": 0}, {}),
        ("batch full", 500.0, {"batch_items": MAX_BATCH}, {}),
        (
            "batch at the collector's smaller cap",
            500.0,
            {"batch_items": 8, "max_batch_size": 8},
            {},
        ),
        ("zero ceiling", 500.0, {}, {"max_queue_delay": 0.0}),
        ("budget spent on compute alone", 500.0, {"oldest_enqueued_at": T0 - 0.095}, {}),
        ("budget smaller than one batch", 500.0, {}, {"max_latency": 0.006}),
    ],
)
def test_goes_at_once(
    case: str, rate: float, overrides: dict[str, Any], policy_overrides: dict[str, Any]
) -> None:
    policy = make_policy(**policy_overrides)
    if rate:
        feed_rate(policy, rate)
    assert policy.max_delay(formation(**overrides)) == 0.0, case


@pytest.mark.parametrize(
    ("case", "rate", "overrides"),
    [
        ("heavy, one instance, backlog", 500.0, {"batch_items": 2}),
        ("heavy, fresh single job with backlog", 500.0, {}),
        (
            "heavy, no backlog but every peer busy",
            900.0,
            {"backlog": False, "instances": 2, "busy_instances": 1},
        ),
        ("medium-heavy, small batch", 400.0, {"batch_items": 1}),
    ],
)
def test_heavy_traffic_waits_for_a_bigger_batch(
    case: str, rate: float, overrides: dict[str, Any]
) -> None:
    policy = make_policy(max_queue_delay=0.05)
    feed_rate(policy, rate)
    f = formation(**overrides)
    delay = policy.max_delay(f)
    age = f.now - f.oldest_enqueued_at
    assert age < delay <= 0.05, case
    # The wait is the time the missing items take to arrive at the observed rate.
    lam = policy.rate_at(f.now)
    target = policy.target_batch_items(lam, f.instances)
    assert target >= f.batch_items + 1
    assert delay == pytest.approx(min(age + (target - f.batch_items) / lam, 0.05), rel=1e-9)


@pytest.mark.parametrize(
    ("rate", "instances", "expected"),
    [
        (0.0, 1, 0.0),
        (20.0, 1, 20 * A / (1 - 20 * B)),
        (300.0, 1, 300 * A / (1 - 300 * B)),
        (500.0, 1, 500 * A / (1 - 500 * B)),
        (600.0, 1, float(MAX_BATCH)),  # lambda * b >= 1: per-item cost alone saturates
        (1000.0, 2, 500 * A / (1 - 500 * B)),  # each of 2 instances serves half
    ],
)
def test_target_batch_items(rate: float, instances: int, expected: float) -> None:
    policy = make_policy()
    assert policy.target_batch_items(rate, instances) == pytest.approx(min(expected, MAX_BATCH))


def test_waits_longer_as_traffic_grows_then_caps() -> None:
    delays = []
    for rate in (20.0, 200.0, 350.0, 450.0, 520.0):
        policy = make_policy(max_queue_delay=1.0, max_latency=math.inf)
        feed_rate(policy, rate)
        delays.append(policy.max_delay(formation()))
    assert delays[0] == 0.0
    assert delays == sorted(delays)
    assert delays[-1] > 0.01


@pytest.mark.parametrize(
    ("budget", "age", "items"),
    [
        (0.100, 0.000, 1),
        (0.030, 0.000, 1),
        (0.030, 0.010, 3),
        (0.020, 0.004, 2),
        (0.012, 0.000, 1),
        (0.012, 0.003, 1),
        (0.065, 0.001, 20),
    ],
)
def test_latency_budget_is_never_exceeded_by_waiting(budget: float, age: float, items: int) -> None:
    policy = make_policy(max_queue_delay=1.0, max_latency=budget)
    feed_rate(policy, 520.0)
    f = formation(oldest_enqueued_at=T0 - age, batch_items=items)
    delay = policy.max_delay(f)
    if delay <= age:
        return
    lam = policy.rate_at(f.now)
    expected_items = items + lam * (delay - age)
    # Going at the deadline with the items present, or with those expected by then, fits.
    assert delay + policy.predicted_cost(items) <= budget + 1e-12
    assert delay + policy.predicted_cost(math.floor(expected_items)) <= budget + 1e-12


@pytest.mark.parametrize(
    ("budget", "age", "items", "waits"),
    [
        (0.100, 0.000, 1, True),
        (0.030, 0.000, 1, True),
        (0.012, 0.005, 1, True),  # 0.3 ms of slack left: a short wait still fits
        (0.0115, 0.005, 1, False),  # 5 ms gone + 6.7 ms compute is already over budget
        (0.0067, 0.000, 1, False),  # exactly one item's compute
    ],
)
def test_latency_budget_table(budget: float, age: float, items: int, waits: bool) -> None:
    policy = make_policy(max_queue_delay=1.0, max_latency=budget)
    feed_rate(policy, 520.0)
    delay = policy.max_delay(formation(oldest_enqueued_at=T0 - age, batch_items=items))
    assert (delay > age) is waits


@pytest.mark.parametrize("ceiling", [0.0, 0.0005, 0.002, 0.005, 0.02])
def test_ceiling_is_hard(ceiling: float) -> None:
    policy = make_policy(max_queue_delay=ceiling, max_latency=math.inf)
    feed_rate(policy, 540.0)
    delay = policy.max_delay(formation())
    assert 0.0 <= delay <= ceiling
    if 0 < ceiling <= 0.005:
        # At saturation the batch wants to fill, so the ceiling is what binds.
        assert delay == ceiling


def test_age_is_counted_from_the_oldest_job() -> None:
    policy = make_policy(max_queue_delay=1.0, max_latency=math.inf)
    feed_rate(policy, 500.0)
    fresh = policy.max_delay(formation())
    aged = policy.max_delay(formation(oldest_enqueued_at=T0 - 0.01))
    # Same remaining wait from now, so the deadline measured from the oldest moves with it.
    assert aged == pytest.approx(fresh + 0.01)


# Cost model --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixed_s", "per_item_s"),
    [(0.005, 0.0017), (0.0, 0.002), (0.02, 0.0), (0.05, 0.01), (0.0005, 0.00005)],
)
def test_cost_fit_recovers_a_and_b(fixed_s: float, per_item_s: float) -> None:
    policy = make_policy()
    feed_costs(policy, fixed_s, per_item_s)
    assert policy.cost_fixed_s == pytest.approx(fixed_s, rel=0.02, abs=1e-5)
    assert policy.cost_per_item_s == pytest.approx(per_item_s, rel=0.02, abs=1e-6)


def max_prediction_error(policy: AdaptivePolicy, fixed_s: float, per_item_s: float) -> float:
    return max(
        abs(policy.predicted_cost(n) / (fixed_s + per_item_s * n) - 1)
        for n in range(1, MAX_BATCH + 1)
    )


@pytest.mark.parametrize("outlier_s", [2.0, 0.5, 0.0])
@pytest.mark.parametrize("outlier_items", [1, 4, MAX_BATCH])
def test_cost_fit_shrugs_off_one_outlier(outlier_s: float, outlier_items: int) -> None:
    policy = make_policy()
    feed_costs(policy, A, B)
    policy.observe_batch(outlier_items, 0, outlier_s)
    assert max_prediction_error(policy, A, B) <= 0.02
    assert policy.cost_fixed_s == pytest.approx(A, rel=0.05)
    assert policy.cost_per_item_s == pytest.approx(B, rel=0.05)


def test_cost_fit_with_noise_shrugs_off_one_outlier() -> None:
    rng = random.Random(3)
    policy = make_policy()
    for i in range(300):
        n = 1 + (i * 7) % MAX_BATCH
        policy.observe_batch(n, 0, (A + B * n) * (1 + 0.1 * rng.gauss(0, 1)))
    before = max_prediction_error(policy, A, B)
    assert before <= 0.1
    policy.observe_batch(MAX_BATCH, 0, 5.0)
    assert max_prediction_error(policy, A, B) <= before + 0.1


@pytest.mark.parametrize("truth_over_prior", [10.0, 0.1])
def test_cost_fit_leaves_a_wrong_prior_quickly(truth_over_prior: float) -> None:
    policy = make_policy()
    feed_costs(policy, A * truth_over_prior, B * truth_over_prior, batches=5)
    assert max_prediction_error(policy, A * truth_over_prior, B * truth_over_prior) <= 0.02


def test_cost_fit_follows_a_real_change() -> None:
    policy = make_policy()
    feed_costs(policy, A, B)
    # The machine got three times slower (say, a neighbour took the cores): a real change
    # that persists must win over the outlier clip.
    feed_costs(policy, 3 * A, 3 * B, batches=300)
    assert policy.predicted_cost(16) == pytest.approx(3 * (A + 16 * B), rel=0.05)


def test_cost_fit_with_one_batch_size_keeps_the_prior_slope() -> None:
    policy = make_policy()
    for _ in range(500):
        policy.observe_batch(1, 0, 0.006)
    assert policy.predicted_cost(1) == pytest.approx(0.006, rel=0.02)
    assert policy.cost_fixed_s >= 0.0
    assert policy.cost_per_item_s >= 0.0


@pytest.mark.parametrize(
    ("observations", "zero_term"),
    [
        # Cost falling with size: no physical per-item term.
        ([(1, 0.010), (8, 0.008), (16, 0.006), (32, 0.004)], "per_item"),
        # A line through below the origin: no physical fixed term.
        ([(1, 0.0001), (8, 0.015), (16, 0.031), (32, 0.063)], "fixed"),
    ],
)
def test_cost_fit_is_never_negative(observations: list[tuple[int, float]], zero_term: str) -> None:
    policy = make_policy()
    for _ in range(100):
        for n, t in observations:
            policy.observe_batch(n, 0, t)
    assert policy.cost_fixed_s >= 0.0
    assert policy.cost_per_item_s >= 0.0
    value = policy.cost_per_item_s if zero_term == "per_item" else policy.cost_fixed_s
    assert value == 0.0


@pytest.mark.parametrize(
    ("items", "compute_s"), [(0, 0.01), (-3, 0.01), (4, math.nan), (4, math.inf), (4, -0.01)]
)
def test_cost_fit_ignores_invalid_observations(items: int, compute_s: float) -> None:
    policy = make_policy()
    policy.observe_batch(items, 0, compute_s)
    assert policy.cost_fixed_s == A
    assert policy.cost_per_item_s == B


# Arrival rate ------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [20.0, 100.0, 500.0, 2000.0])
def test_rate_estimate_tracks_steady_traffic(rate: float) -> None:
    policy = make_policy()
    feed_rate(policy, rate)
    # Sampled just after an arrival, the estimate carries half an item of that arrival.
    assert policy.arrival_rate == pytest.approx(rate, rel=0.05, abs=6.0)


@pytest.mark.parametrize(("gap_s", "at_most"), [(0.1, 510 * math.exp(-1)), (0.5, 4.0), (5.0, 1e-6)])
def test_rate_estimate_falls_after_an_idle_gap(gap_s: float, at_most: float) -> None:
    policy = make_policy()
    feed_rate(policy, 500.0)
    assert policy.rate_at(T0 + gap_s) <= at_most


def test_lone_request_after_idle_goes_at_once() -> None:
    policy = make_policy(max_queue_delay=0.05)
    feed_rate(policy, 520.0)
    assert policy.max_delay(formation(batch_items=2)) > 0.0
    later = T0 + 1.0
    policy.observe_arrival(later, 1)
    assert policy.arrival_rate < 15.0
    assert policy.max_delay(formation(now=later, oldest_enqueued_at=later, batch_items=1)) == 0.0


def test_burst_counts_as_its_size() -> None:
    policy = make_policy()
    policy.observe_arrival(T0, 100)
    assert policy.arrival_rate == pytest.approx(100 / 0.1)
    assert policy.rate_at(T0 + 0.1) == pytest.approx(100 / 0.1 * math.exp(-1))


@pytest.mark.parametrize(("now", "items"), [(math.nan, 1), (math.inf, 1), (T0, 0), (T0, -5)])
def test_rate_estimate_ignores_invalid_arrivals(now: float, items: int) -> None:
    policy = make_policy()
    policy.observe_arrival(now, items)
    assert policy.arrival_rate == 0.0


def test_out_of_order_arrival_still_counts() -> None:
    policy = make_policy()
    policy.observe_arrival(T0, 1)
    policy.observe_arrival(T0 - 0.001, 1)
    assert policy.arrival_rate == pytest.approx(2 / 0.1)


# Bounds, for any finite inputs --------------------------------------------------------------

finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)
history = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=10.0, allow_nan=False),
        st.integers(min_value=-2, max_value=64),
    ),
    max_size=40,
)
batches = st.lists(
    st.tuples(
        st.integers(min_value=-1, max_value=64),
        st.floats(min_value=-1.0, max_value=10.0, allow_nan=False),
    ),
    max_size=20,
)
formations = st.builds(
    Formation,
    now=finite,
    oldest_enqueued_at=finite,
    batch_items=st.integers(min_value=-5, max_value=10_000),
    batch_tokens=st.integers(min_value=0, max_value=10**6),
    max_batch_size=st.integers(min_value=-1, max_value=10_000),
    backlog=st.booleans(),
    busy_instances=st.integers(min_value=-1, max_value=16),
    instances=st.integers(min_value=-1, max_value=16),
)


@settings(max_examples=400, deadline=None)
@given(
    ceiling=st.floats(min_value=0.0, max_value=10.0, allow_nan=False),
    budget=st.one_of(st.just(math.inf), st.floats(min_value=1e-6, max_value=100.0)),
    gaps=history,
    observed=batches,
    f=formations,
)
def test_max_delay_is_always_within_bounds(
    ceiling: float,
    budget: float,
    gaps: list[tuple[float, int]],
    observed: list[tuple[int, float]],
    f: Formation,
) -> None:
    policy = make_policy(max_queue_delay=ceiling, max_latency=budget)
    t = f.now - 1.0
    for gap, items in gaps:
        # Start a second before `now` so the history mixes stale, recent and future stamps.
        t += gap / 10
        policy.observe_arrival(t, items)
    for items, compute_s in observed:
        policy.observe_batch(items, 0, compute_s)
    delay = policy.max_delay(f)
    assert isinstance(delay, float)
    assert math.isfinite(delay)
    assert 0.0 <= delay <= ceiling
    assert policy.cost_fixed_s >= 0.0
    assert policy.cost_per_item_s >= 0.0
    assert math.isfinite(policy.arrival_rate)
    age = max(0.0, f.now - f.oldest_enqueued_at)
    if delay > age and math.isfinite(budget):
        assert delay + policy.predicted_cost(max(1, f.batch_items)) <= budget * (1 + 1e-9)


@settings(max_examples=200, deadline=None)
@given(
    low=st.floats(min_value=0.0, max_value=5000.0),
    high=st.floats(min_value=0.0, max_value=5000.0),
    instances=st.integers(min_value=1, max_value=8),
)
def test_target_grows_with_the_rate(low: float, high: float, instances: int) -> None:
    low, high = sorted((low, high))
    policy = make_policy()
    small = policy.target_batch_items(low, instances)
    big = policy.target_batch_items(high, instances)
    assert 0.0 <= small <= big <= MAX_BATCH


# Simulation ---------------------------------------------------------------------------------

COST = linear_cost(A, B)
CAPACITY = MAX_BATCH / COST(MAX_BATCH)  # ~539 items/s at full batches
SIM_JOBS = 20_000
SIM_WARMUP = 1_000


def run(
    policy: FixedPolicy | AdaptivePolicy,
    ceiling: float,
    *,
    jobs: int = SIM_JOBS,
    warmup_jobs: int = SIM_WARMUP,
    **load: Any,
) -> SimResult:
    return simulate(
        policy,
        max_queue_delay=ceiling,
        max_batch_size=MAX_BATCH,
        cost=COST,
        jobs=jobs,
        seed=7,
        warmup_jobs=warmup_jobs,
        **load,
    )


def compare(**load: Any) -> dict[str, SimResult]:
    return {
        "fixed 0 ms": run(FixedPolicy(0.0), 0.0, **load),
        "fixed 5 ms": run(FixedPolicy(0.005), 0.005, **load),
        "adaptive": run(make_policy(), CAP, **load),
    }


def test_simulator_serves_a_lone_client_at_batch_cost() -> None:
    think_s = 0.001
    result = run(FixedPolicy(0.0), 0.0, jobs=2_000, warmup_jobs=100, clients=1, think_s=think_s)
    assert result.jobs == 1_900
    assert result.mean_latency_s == pytest.approx(COST(1))
    assert result.p99_latency_s == pytest.approx(COST(1))
    assert result.mean_batch_items == 1.0
    # One request in flight at a time: the next is sent think_s after each answer.
    assert result.throughput_per_s == pytest.approx(1 / (COST(1) + think_s))


@pytest.mark.parametrize("instances", [1, 2])
def test_simulator_fills_batches_and_keeps_every_instance_busy_under_a_backlog(
    instances: int,
) -> None:
    # Far more clients than one batch holds: each instance runs full batches back to back.
    result = run(
        FixedPolicy(0.005),
        0.005,
        jobs=4_000,
        warmup_jobs=500,
        clients=4 * MAX_BATCH * instances,
        instances=instances,
    )
    assert result.mean_batch_items == pytest.approx(MAX_BATCH, rel=0.02)
    assert result.throughput_per_s == pytest.approx(instances * CAPACITY, rel=0.02)


@pytest.mark.parametrize(
    ("load", "rate", "jobs"),
    [
        # Light traffic: one batch per job, nothing queues; fewer jobs say as much, faster.
        ("light", 20.0, 5_000),
        ("medium", 0.7 * CAPACITY, SIM_JOBS),
        ("heavy", 1.1 * CAPACITY, SIM_JOBS),
    ],
)
def test_simulated_mean_latency_matches_the_better_fixed_window(
    load: str, rate: float, jobs: int
) -> None:
    results = compare(rate_per_s=rate, jobs=jobs)
    best = min(results["fixed 0 ms"].mean_latency_s, results["fixed 5 ms"].mean_latency_s)
    # 2 % covers sampling noise between policies that batch slightly differently.
    assert results["adaptive"].mean_latency_s <= best * 1.02, (load, results)


@pytest.mark.parametrize(
    ("load", "rate", "clients"),
    [
        ("70% open loop", 0.7 * 2 * CAPACITY, None),
        ("64 clients", None, 64),
        ("16 clients", None, 16),
    ],
)
def test_simulated_two_instances_keep_up_with_the_better_fixed_window(
    load: str, rate: float | None, clients: int | None
) -> None:
    """Two instances fragment batches under a zero window; adaptive must not fall behind."""
    extra: dict[str, Any] = {"instances": 2}
    if clients is None:
        extra["rate_per_s"] = rate
    else:
        extra["clients"] = clients
        extra["think_s"] = 0.0005
    results = compare(**extra)
    fixed = (results["fixed 0 ms"], results["fixed 5 ms"])
    adaptive = results["adaptive"]
    if clients is None:
        assert adaptive.p99_latency_s <= min(r.p99_latency_s for r in fixed) * 1.05, results
        assert adaptive.mean_latency_s <= min(r.mean_latency_s for r in fixed) * 1.05, results
    else:
        assert adaptive.throughput_per_s >= max(r.throughput_per_s for r in fixed) * 0.98, results
