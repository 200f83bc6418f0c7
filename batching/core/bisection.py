"""A batch run so that a failing input fails only its own request: when the model raises on a
batch, the batch is bisected and each half run again, down to the one job that holds the
failing input. That job's request fails (the model's :class:`~batching.errors.ClientError` as
it is, anything else as :class:`~batching.errors.InferenceFailed`, logged); every other job is
served. A lost instance is not the input's fault: it ends the run at once."""

from __future__ import annotations

import logging
from collections.abc import Callable

from batching.errors import ClientError, InferenceFailed

from .jobs import InstanceLost, ItemT, Job, RunBatch
from .packing import inputs_of, padded_tokens

__all__ = ["ObserveBatch", "run_bisecting"]

logger = logging.getLogger("batching")

#: Told of each batch the model ran to the end: its items, padded tokens and compute seconds,
#: and whether its rate is to be learnt (a whole batch that shows what a busy instance does;
#: never a half of a failed one).
ObserveBatch = Callable[[int, int, float, bool], None]


async def run_bisecting(
    run: RunBatch[ItemT],
    jobs: list[Job[ItemT]],
    name: str,
    observe: ObserveBatch,
    learn: bool = False,
) -> tuple[int, int, float]:
    """Run ``jobs`` as one batch; when the model raises, bisect so that only the jobs holding
    a failing input fail. Returns items, padded tokens and compute seconds.

    :param name: the model's name, for logs.
    :param learn: handed to ``observe`` when the whole batch runs (its halves never learn).
    :raises InstanceLost: the instance died (every job is then the caller's to fail).
    """
    inputs = inputs_of(jobs)
    tokens = padded_tokens(jobs)
    try:
        outputs, compute_s = await run(inputs)
    except InstanceLost:
        raise
    except Exception as exc:
        if len(jobs) == 1:
            _fail_alone(jobs[0], exc, name)
            return len(inputs), tokens, 0.0
        middle = len(jobs) // 2
        left = await run_bisecting(run, jobs[:middle], name, observe)
        right = await run_bisecting(run, jobs[middle:], name, observe)
        return left[0] + right[0], left[1] + right[1], left[2] + right[2]
    if len(outputs) != len(inputs):
        logger.error(
            "model %s returned %d outputs for %d inputs; failing requests %s",
            name,
            len(outputs),
            len(inputs),
            ",".join(job.request.request_id or "-" for job in jobs),
        )
        failure = InferenceFailed("the model returned the wrong number of outputs")
        for job in jobs:
            job.request.fail(failure)
        return len(inputs), tokens, compute_s
    observe(len(inputs), tokens, compute_s, learn)
    offset = 0
    for job in jobs:
        job.request.settle(job.start, outputs[offset : offset + job.size])
        offset += job.size
    return len(inputs), tokens, compute_s


def _fail_alone(job: Job[ItemT], exc: Exception, name: str) -> None:
    """The one job left holds the input the model failed on."""
    request_id = job.request.request_id or "-"
    if isinstance(exc, ClientError):
        # The model says this input is one it cannot take: the client's to fix.
        logger.debug("model %s refused request %s: %s", name, request_id, exc)
        job.request.fail(exc)
        return
    logger.error("model %s failed on request %s: %r", name, request_id, exc, exc_info=exc)
    job.request.fail(InferenceFailed("the model failed on this request's input"))
