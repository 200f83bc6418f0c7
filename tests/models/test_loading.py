"""Loads take turns, in the order asked; a load stuck past the patience lets the next go
beside it; a turn given up before it came is skipped; a thread holding a turn may nest."""

from __future__ import annotations

import threading

from batching.models.loading import Loading


def test_turns_come_in_the_order_they_were_taken() -> None:
    line = Loading()
    turns = [line.take(f"m{i}") for i in range(4)]
    order: list[str] = []
    threads = [
        threading.Thread(target=lambda t=turn: (t.wait(), order.append(t.what), t.done()))
        for turn in reversed(turns)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert order == ["m0", "m1", "m2", "m3"]


def test_a_turn_given_up_is_skipped_and_its_waiter_told() -> None:
    line = Loading()
    first, second, third = line.take("a"), line.take("b"), line.take("c")
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(second.wait()))
    waiter.start()
    second.done()  # its load was cancelled while it waited
    waiter.join(10)
    assert waited == [False]
    assert first.wait()
    first.done()
    assert third.wait()
    third.done()


def test_a_load_held_past_the_patience_lets_the_next_go_beside_it() -> None:
    line = Loading(patience_s=0.05)
    stuck, next_one = line.take("stuck"), line.take("next")
    assert stuck.wait()
    assert next_one.wait()  # returns once the stuck load has held its turn 50 ms
    next_one.done()
    stuck.done()


def test_a_thread_holding_a_turn_runs_nested_blocks_at_once() -> None:
    line = Loading()
    with line.turn("outer"), line.turn("inner"):
        pass
    other = line.take("after")
    assert other.wait()
    other.done()
