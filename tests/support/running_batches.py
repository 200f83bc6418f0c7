"""What the running-batch tests of both decode loops share (causal: ``DecodeBatch``,
encoder-decoder: ``Seq2SeqDecodeBatch``): items, a driver that steps a batch while others
join, and the checks both loops must pass alike."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from batching.models.generation.pieces import Joining, Status
from batching.models.parameters import TaskItem


def item(text: str, tokens: int) -> TaskItem:
    return TaskItem(text, (("max_new_tokens", tokens),))


def run(
    batch: Any, joins: dict[int, list[tuple[int, TaskItem]]], together: bool = False
) -> dict[int, list[int]]:
    """Steps ``batch`` until it is empty; before step ``n``, the items of ``joins[n]`` join
    (one by one, or ``together`` in one prefill)."""
    tokens: dict[int, list[int]] = {}
    step = 0
    while len(batch) or any(n >= step for n in joins):
        ended: set[int] = set()
        for piece in batch.step():
            tokens[piece.key].append(piece.token_id)
            if piece.finish:
                ended.add(piece.key)
        newcomers = joins.get(step, [])
        if together and newcomers:
            pieces = batch.join_items([Joining(key, entry) for key, entry in newcomers])
        else:
            pieces = [batch.join_item(key, entry) for key, entry in newcomers]
        for piece in pieces:
            assert not isinstance(piece, BaseException)
            tokens[piece.key] = [piece.token_id]
            if piece.finish:
                ended.add(piece.key)
        batch.leave(ended)
        step += 1
    return tokens


def check_seeded_sampling(make: Callable[[], Any], prompts: Sequence[str]) -> None:
    """A seeded, sampled row draws the same tokens alone and among rows that come and go."""
    sampled = TaskItem(
        prompts[2], (("do_sample", True), ("max_new_tokens", 12), ("seed", 7), ("top_p", 0.9))
    )
    alone = run(make(), {0: [(0, sampled)]})[0]
    company = run(
        make(),
        {0: [(1, item(prompts[0], 5))], 2: [(0, sampled), (2, item(prompts[1], 20))]},
    )
    assert company[0] == alone


def check_stop_string(make: Callable[[], Any], prompt: str, shortest: int) -> None:
    """A stop string ends its row, and no text from it on is sent."""
    batch = make()
    pieces = [batch.join_item(0, item(prompt, 20))]
    while pieces[-1].finish is None:
        pieces.extend(batch.step())
    whole = "".join(piece.text for piece in pieces)
    assert len(whole) > shortest
    stop = whole[2:4]
    batch = make()
    stopped = TaskItem(prompt, (("max_new_tokens", 20), ("stop", (stop,))))
    pieces = [batch.join_item(0, stopped)]
    while pieces[-1].finish is None:
        pieces.extend(batch.step())
    assert "".join(piece.text for piece in pieces) == whole[: whole.find(stop)]
    assert pieces[-1].finish is Status.FINISHED_STOP


def check_company_free(make: Callable[[], Any], items: Sequence[TaskItem], expected: Any) -> None:
    """Each item's greedy tokens are ``expected[i]`` alone, in a burst of all of them joining
    at once, and joining a running batch at different steps (its cache longer or shorter than
    the newcomer's, rows leaving in between)."""
    for index in (0, 3, 9):
        alone = run(make(), {0: [(index, items[index])]})
        assert alone[index] == expected[index]
    burst = run(make(), {0: list(enumerate(items))})
    assert [burst[i] for i in range(len(items))] == list(expected)
    joins: dict[int, list[tuple[int, TaskItem]]] = {}
    for index, entry in enumerate(items):
        joins.setdefault((index * 5) % 17, []).append((index, entry))
    joined = run(make(), joins)
    assert [joined[i] for i in range(len(items))] == list(expected)
