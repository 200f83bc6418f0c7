"""A run of decode steps on the instance's thread (batching.runtime.step_run): it steps on
while nothing the event loop decides has changed, posts each step's pieces in order, and lets
finished rows leave at once."""

from __future__ import annotations

from dataclasses import dataclass

from batching.models.generation.pieces import Piece, Status
from batching.runtime.step_run import StepRun


class Rows:
    """A running batch of rows that each end after their count of steps."""

    def __init__(self, lengths: dict[int, int], fail_at: int | None = None) -> None:
        self.left = dict(lengths)
        self.steps = 0
        self.fail_at = fail_at
        self.gone: list[set[int]] = []

    def __len__(self) -> int:
        return len(self.left)

    def step(self) -> list[Piece]:
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("the model broke")
        pieces = []
        for key in list(self.left):
            self.left[key] -= 1
            finish = Status.FINISHED_LENGTH if self.left[key] == 0 else None
            pieces.append(Piece(key, self.steps, "x", finish, 1))
        return pieces

    def leave(self, keys: set[int]) -> None:
        self.gone.append(set(keys))
        for key in keys:
            self.left.pop(key, None)


@dataclass
class Watched:
    deadline: float = 100.0
    status: Status = Status.RUNNING


def run_of(
    batch: Rows, streams: dict[int, Watched], **options: object
) -> tuple[StepRun, list[list[Piece]]]:
    posted: list[list[Piece]] = []
    waiting = options.pop("waiting", lambda: False)
    now = options.pop("now", lambda: 0.0)
    run = StepRun(
        batch,
        set(),
        list(streams.items()),
        waiting,  # type: ignore[arg-type]
        now,  # type: ignore[arg-type]
        lambda pieces, seconds: posted.append(pieces),
        **options,  # type: ignore[arg-type]
    )
    return run, posted


def test_a_run_steps_until_its_rows_have_all_finished_posting_each_step_in_order() -> None:
    batch = Rows({1: 2, 2: 4})
    run, posted = run_of(batch, {1: Watched(), 2: Watched()})
    assert run(None) is None
    assert batch.steps == 4
    assert [[(p.key, p.token_id) for p in step] for step in posted] == [
        [(1, 1), (2, 1)],
        [(1, 2), (2, 2)],
        [(2, 3)],
        [(2, 4)],
    ]
    # The row that finished left right after its last step, not at the end of the run.
    assert {1} in batch.gone[:3]


def test_a_run_hands_back_as_soon_as_a_newcomer_waits() -> None:
    batch = Rows({1: 100})
    waits = iter([False, False, True])
    run, posted = run_of(batch, {1: Watched()}, waiting=lambda: next(waits))
    assert run(None) is None
    assert batch.steps == 3 and len(posted) == 3


def test_a_run_hands_back_when_a_stream_is_cancelled_or_past_its_deadline() -> None:
    cancelled = Watched()
    batch = Rows({1: 100, 2: 100})
    run, _ = run_of(batch, {1: cancelled, 2: Watched()})
    cancelled.status = Status.FINISHED_CANCELLED
    run(None)
    assert batch.steps == 1
    late = Watched(deadline=5.0)
    batch = Rows({1: 100})
    ticks = iter([1.0, 2.0, 6.0])
    run, _ = run_of(batch, {1: late}, now=lambda: next(ticks))
    run(None)
    assert batch.steps == 3


def test_a_stream_that_ended_by_its_own_rows_does_not_end_the_run() -> None:
    short = Watched()
    batch = Rows({1: 1, 2: 5})
    run, _ = run_of(batch, {1: short, 2: Watched()})
    # What the loop does when the first step's piece reaches it: the stream is finished.
    short.status = Status.FINISHED_LENGTH
    run(None)
    assert batch.steps == 5


def test_a_run_is_bounded_by_its_steps() -> None:
    batch = Rows({1: 1000})
    run, posted = run_of(batch, {1: Watched()}, max_steps=7)
    run(None)
    assert batch.steps == 7 and len(posted) == 7


def test_a_step_that_raises_ends_the_run_and_its_rows_leave() -> None:
    batch = Rows({1: 10, 2: 10}, fail_at=3)
    run, posted = run_of(batch, {1: Watched(), 2: Watched()})
    failed = run(None)
    assert isinstance(failed, RuntimeError)
    assert len(posted) == 2
    assert len(batch) == 0


def test_a_run_ends_when_the_event_loop_it_posts_to_has_closed() -> None:
    batch = Rows({1: 100})
    posted: list[int] = []

    def post(pieces: list[Piece], seconds: float) -> None:
        posted.append(len(pieces))
        if len(posted) == 2:
            raise RuntimeError("Event loop is closed")

    run = StepRun(batch, set(), [(1, Watched())], lambda: False, lambda: 0.0, post)
    assert run(None) is None
    assert batch.steps == 2
