"""The cores of one process, lent to the models' computations: never more threads lent than
cores, a busy model's share when others are busy too, the whole machine when it is alone, and
waiting in turn."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from batching.models.engines.cores import PATIENCE_S, RECENT_S, Cores, Party


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pool(clock: Clock) -> Iterator[Cores]:
    cores = Cores(2, clock=clock)
    cores.on_grant = lambda count: None
    yield cores


def test_a_model_alone_gets_every_core(pool: Cores) -> None:
    alone = pool.party("alone")
    with alone.take(2) as granted:
        assert granted == 2 and pool.granted() == 2 and pool.lent == 2
    assert pool.lent == 0 and pool.granted() is None


def test_a_nested_take_gets_the_outer_threads(pool: Cores) -> None:
    with pool.party("m").take(2) as outer, pool.party("m").take(2) as inner:
        assert (outer, inner, pool.lent) == (2, 2, 2)


def test_a_model_that_was_busy_a_moment_ago_keeps_its_share(pool: Cores, clock: Clock) -> None:
    first, second = pool.party("first"), pool.party("second")
    with first.take(2):
        pass
    with second.take(2) as granted:
        assert granted == 1  # first ran just now: it will be back
    clock.now += RECENT_S * 2
    with second.take(2) as granted:
        assert granted == 2  # first has been idle for a while: all of it


def test_weights_divide_the_cores(clock: Clock) -> None:
    pool = Cores(8, clock=clock)
    pool.on_grant = lambda count: None
    heavy, light = pool.party("heavy", 3.0), pool.party("light", 1.0)
    with light.take(8) as granted:
        assert granted == 8
    with heavy.take(8) as granted:
        assert granted == 6  # light is still busy lately: 8 x 3 / 4


def test_a_share_is_split_among_one_models_computations(clock: Clock) -> None:
    pool = Cores(8, clock=clock)
    pool.on_grant = lambda count: None
    model = pool.party("m")
    with model.take(2) as first, model.take(8) as nested:
        assert (first, nested) == (2, 2)  # the same thread: the same computation
    grants: list[int] = []
    with model.take(2) as first:
        thread = threading.Thread(target=lambda: grants.append(_take(model, 8)))
        thread.start()
        thread.join(10)
    # Its second instance, while the first computes: half the model's share of 8.
    assert (first, grants) == (2, [4])


def _take(party: Party, wanted: int) -> int:
    with party.take(wanted) as granted:
        return granted


def test_a_computation_waits_in_turn_for_cores_that_are_not_free(pool: Cores) -> None:
    holder, waiter = pool.party("holder"), pool.party("waiter")
    waiting = threading.Event()
    pool.on_wait = lambda name: waiting.set()
    grants: list[int] = []
    with holder.take(2):
        thread = threading.Thread(target=lambda: grants.append(_take(waiter, 2)))
        thread.start()
        assert waiting.wait(10)
        assert grants == []  # no core is free while the holder computes
    thread.join(10)
    assert grants == [1]  # the holder was busy just now: the waiter's share is one


def test_threads_lent_never_exceed_the_cores_and_every_taker_gets_its_turn(clock: Clock) -> None:
    pool = Cores(2, clock=clock)
    pool.on_grant = lambda count: None
    lent_seen: list[int] = []
    guard = threading.Lock()
    parties = [pool.party(f"m{i}") for i in range(3)]

    def work(index: int) -> None:
        for _ in range(200):
            with parties[index % 3].take(2, at_least=1 + index % 2) as granted:
                with guard:
                    lent_seen.append(pool.lent)
                assert granted >= 1 + index % 2

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert len(lent_seen) == 1200 and max(lent_seen) <= 2 and pool.lent == 0


def test_a_grant_sets_the_computing_threads_count(pool: Cores) -> None:
    told: list[int] = []
    pool.on_grant = told.append
    with pool.party("m").take(2):
        pass
    assert told == [2]


def test_a_share_must_be_positive(pool: Cores) -> None:
    with pytest.raises(ValueError, match="above 0"):
        pool.party("m", 0.0)


def test_a_stuck_computation_does_not_hold_the_others_for_longer_than_the_patience(
    pool: Cores,
) -> None:
    stuck, other = pool.party("stuck"), pool.party("other")
    grants: list[int] = []
    with stuck.take(2):
        thread = threading.Thread(target=lambda: grants.append(_take(other, 2)))
        thread.start()
        thread.join(PATIENCE_S * 20)
        assert grants == [1]  # it ran beside the stuck one, on one thread
    assert pool.lent == 0
