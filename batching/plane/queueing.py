"""Items through a model's batcher: what the data plane checks before it queues them (a
fill-mask text's mask token, a media item's size and form), the units of items that are
several units of batching (:mod:`batching.expansion`), and the wait for their outputs, the
deadline or the client's departure, whichever comes first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from batching.core.jobs import Pending
from batching.documents import listed
from batching.errors import ClientGone, DeadlineExceeded, NotReady, UnprocessableInput
from batching.expansion import expand_items
from batching.models.items import Item
from batching.models.media import check_media, media_inputs, model_limits
from batching.models.parameters import TaskItem
from batching.runtime.deployment import Deployment
from batching.tracing.spans import current_span

from .calls import Call
from .counting import tokens_for_batching

__all__ = ["check_mask_token", "check_media_items", "queue_items"]


def check_mask_token(metadata: Mapping[str, object], inputs: Sequence[Item]) -> None:
    """Refuse the texts a fill-mask model cannot take: its metadata names the ``mask_token``
    each text must hold (the model predicts the word at it), and a text without one would
    fail the model's batch. Checked before the items are queued, so one bad text never fails
    the batch it would have joined.

    :raises UnprocessableInput: naming the first text without the token.
    """
    token = metadata.get("mask_token")
    if not isinstance(token, str) or not token:
        return
    for index, item in enumerate(inputs):
        if isinstance(item, TaskItem):
            item = item.input
        if isinstance(item, str) and token not in item:
            raise UnprocessableInput(
                f"inputs[{index}] has no {token} token: this fill-mask model predicts the word "
                f'at {token} in each text, e.g. "Paris is the {token} of France."'
            )


async def check_media_items(deployment: Deployment, inputs: Sequence[Item]) -> None:
    """Refuse the media items (images, ...) a model cannot take, before they are queued: too
    large (413, from the header: pixels, or the memory decoding would take) or undecodable
    (400). On a worker thread: decoding an image takes milliseconds the event loop owes to
    every other request."""
    media = media_inputs(deployment.metadata)
    if not media:
        return
    several = len(listed(deployment.metadata.get("inputs"))) > 1
    limits = model_limits(deployment.config.media_limits, deployment.metadata)
    await asyncio.to_thread(check_media, media, several, inputs, limits)


async def queue_items(
    call: Call,
    inputs: Sequence[Item],
    *,
    tokens: list[int] | None = None,
    token_cap: int | None = None,
) -> list[object]:
    """Queue ``inputs`` and wait for their outputs, in order; a model that expands its items
    (:mod:`batching.expansion`) runs their units and answers each item from its units'.

    :param tokens: the inputs' ``count_tokens``, when already counted; counted here when the
        model is batched by tokens otherwise.
    :param token_cap: with ``tokens``, the padded tokens every batch these items run in may
        carry, whether or not the model is batched by tokens (outputs that grow with tokens,
        such as per-token vectors; see :meth:`Batcher.submit`).
    :raises ClientGone: the client went away first (its items are dropped wherever they are
        in the queue).
    :raises UnprocessableInput: the model cannot take an input (a fill-mask text without its
        mask token) or cannot tokenise it.
    :raises DeadlineExceeded: not served before the deadline; the message says which limit
        set it and whether it passed while the request was queued or running.
    :raises BatchingError: refused at admission (see :meth:`Batcher.submit`).
    :raises InvalidRequest: the model cannot expand one of these items.
    """
    deployment = call.deployment
    units = inputs if isinstance(inputs, list) else list(inputs)
    expansion = await expand_items(deployment, inputs)
    if expansion is not None:
        # The units are counted, queued and packed like items; the counts were of items.
        units, tokens, token_cap = expansion.units, None, None
    check_mask_token(deployment.metadata, units)
    await check_media_items(deployment, units)
    if token_cap is not None and tokens is not None and len(tokens) == len(units):
        pass  # counted already, and needed for the cap whatever the model's batching
    elif deployment.count_tokens is None:
        tokens = None
    elif tokens is None or len(tokens) != len(units):
        tokens = await tokens_for_batching(deployment, units, call.request_id)
    span = current_span()
    future = deployment.batcher.submit(
        units,
        deadline=call.deadline,
        tokens=tokens,
        request_id=call.request_id,
        token_cap=token_cap if tokens is not None else None,
        trace=span,
    )
    if span is not None:
        span.submitted(deployment.name, len(units), tokens)
    outputs = await _outputs(call, future)
    return outputs if expansion is None else expansion.answers(outputs)


#: How long a queued request waits for its outputs before a watcher starts looking out for its
#: client leaving. Most answers of a fast model come sooner (the default model's batch of one
#: takes 2-3 ms), and a watcher costs a task per request, started and then cancelled: with a
#: model that answers at once, a tenth of the event loop's time per request (profiled). A
#: client gone before then is noticed then, and its items are dropped wherever they are.
WATCH_AFTER = 0.005


async def _outputs(call: Call, future: Pending) -> list[object]:
    """The outputs of the queued ``future``, unless the deadline passes or the client goes
    away first (then its items are dropped wherever they are in the queue).

    One timer on the loop and a callback on ``future`` wait for all three: the timer fires at
    the deadline, or first :data:`WATCH_AFTER` from now to start the watcher."""
    loop = asyncio.get_running_loop()
    deadline = call.deadline
    disconnected = call.caller.disconnected
    waiter: asyncio.Future[None] = loop.create_future()
    watcher: asyncio.Future[None] | None = None

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    def watch() -> None:
        nonlocal watcher
        assert disconnected is not None
        watcher = asyncio.ensure_future(disconnected())
        watcher.add_done_callback(wake)
        timers.append(loop.call_at(deadline, wake))

    watch_at = loop.time() + WATCH_AFTER
    if disconnected is not None and watch_at < deadline:
        timers = [loop.call_at(watch_at, watch)]
    else:
        timers = [loop.call_at(deadline, wake)]
    future.add_done_callback(wake)
    try:
        await waiter
    except asyncio.CancelledError:
        # The door's own task was cancelled (its call or connection ended): the items are
        # dropped wherever they are in the queue, never computed for nobody.
        future.cancel()
        raise
    finally:
        for timer in timers:
            timer.cancel()
        future.remove_done_callback(wake)
        if watcher is not None:
            watcher.cancel()
    if not future.done():
        running = future.running
        future.cancel()
        if watcher is not None and watcher.done():
            raise ClientGone("the client went away before its answer")
        raise call.expired(running)
    try:
        outputs = future.result()
    except DeadlineExceeded:
        # The batcher saw the deadline pass in the queue a moment before the timer above.
        raise call.expired(future.running) from None
    except NotReady:
        # Accepted, then its instance died or the server shut down before serving it.
        call.refused("not_ready")
        raise
    return outputs
