"""A request's own token cap (items whose outputs grow with their tokens, like per-token
vectors): the batches its items run in stay under it, on virtual time with injected counts."""

from __future__ import annotations

import asyncio
import contextlib
import math

from batching.core.batcher import Batcher
from batching.core.jobs import Job, Pending, Submission
from batching.core.packing import Batch
from batching.core.policy import FixedPolicy
from batching.model_config import BatchingConfig
from tests.support.fakes import ScriptedRunner, run_virtual

MS = 0.001
FAR = math.inf


def _request(tokens: list[int], token_cap: int | None = None) -> Submission:
    loop = asyncio.new_event_loop()
    try:
        future = Pending(loop=loop)
    finally:
        loop.close()
    return Submission(
        items=["x"] * len(tokens),
        tokens=tokens,
        future=future,
        enqueued_at=0.0,
        deadline=FAR,
        results=[None] * len(tokens),
        unresolved=len(tokens),
        token_cap=token_cap,
    )


def test_a_capped_request_splits_at_its_cap_without_a_model_cap() -> None:
    batch = Batch(max_items=32, max_tokens=None)
    request = _request([10] * 8, token_cap=50)
    rest = batch.take(Job(request, 0, 8))
    # 5 x 10 = 50 fits; a sixth item would make 60.
    assert batch.items == 5
    assert rest is not None and (rest.start, rest.stop) == (5, 8)
    assert batch.full


def test_the_cap_then_holds_for_what_joins_after() -> None:
    batch = Batch(max_items=32, max_tokens=None)
    assert batch.take(Job(_request([10] * 2, token_cap=40), 0, 2)) is None
    plain = _request([10] * 5)
    rest = batch.take(Job(plain, 0, 5))
    assert batch.items == 4
    assert rest is not None and rest.start == 2


def test_a_capped_request_does_not_join_a_batch_already_over_its_cap() -> None:
    batch = Batch(max_items=32, max_tokens=None)
    assert batch.take(Job(_request([30] * 3), 0, 3)) is None
    capped = Job(_request([10], token_cap=60), 0, 1)
    assert batch.take(capped) is capped
    # Refused, it leaves the batch's cap as it was: more uncapped items still fit.
    assert batch.max_tokens is None
    assert batch.take(Job(_request([30] * 2), 0, 2)) is None
    assert batch.items == 5


def test_the_lower_of_the_model_cap_and_the_request_cap_applies() -> None:
    batch = Batch(max_items=32, max_tokens=100)
    batch.take(Job(_request([10] * 20, token_cap=300), 0, 20))
    assert batch.items == 10
    batch = Batch(max_items=32, max_tokens=100)
    batch.take(Job(_request([10] * 20, token_cap=30), 0, 20))
    assert batch.items == 3


def test_a_lone_item_over_the_cap_still_runs() -> None:
    batch = Batch(max_items=32, max_tokens=None)
    assert batch.take(Job(_request([500], token_cap=100), 0, 1)) is None
    assert batch.items == 1


def test_the_batcher_runs_capped_requests_in_batches_under_their_cap() -> None:
    async def main() -> None:
        config = BatchingConfig(max_batch_size=32)
        batcher = Batcher("m", config, FixedPolicy(config.max_queue_delay))
        batcher.instances = batcher.ready_instances = 1
        runner = ScriptedRunner(cost=lambda n: 1 * MS)
        task = asyncio.get_running_loop().create_task(batcher.serve(runner.run))
        blocker = batcher.submit(["b"], deadline=FAR, tokens=[5])
        await runner.started.wait()
        capped = batcher.submit(["t"] * 7, deadline=FAR, tokens=[20] * 7, token_cap=60)
        plain = batcher.submit(["p"] * 7, deadline=FAR, tokens=[20] * 7)
        await asyncio.gather(blocker, capped, plain)
        # 3 x 20 = 60 per capped batch; a split request's rest goes round behind the plain
        # one, whose 7 items run together (7 x 20 = 140: no cap of theirs, none of the model).
        assert runner.sizes == [1, 3, 7, 3, 1]
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    run_virtual(main)
