"""The data plane: the one request path every protocol calls.

A front door (plain HTTP, KServe v2, ...) is a codec around it: it decodes its wire format
into a list of inputs, asks :class:`DataPlane` to resolve the model, set the deadline, submit
the inputs and wait for their outputs, and encodes what comes back. Admission, deadlines,
disconnects and per-request metrics therefore behave the same whichever door a request came
through. Nothing here knows HTTP: status codes are the doors' business (they pass the one they
answered to :meth:`DataPlane.record`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics import Counter

from batching.errors import (
    DeadlineExceeded,
    ModelNotFound,
    NotReady,
    UnprocessableInput,
)
from batching.expansion import expand_items
from batching.metrics import Metrics
from batching.models.items import item_text
from batching.models.media import check_media, media_inputs, model_limits
from batching.models.parameters import TaskItem
from batching.runtime.deployment import Deployment
from batching.tracing.spans import current_span

__all__ = [
    "DataPlane",
    "Deadline",
    "Deployments",
    "TokenCounts",
    "check_mask_token",
    "untokenizable",
]

logger = logging.getLogger("batching")

#: Inputs with more characters than this in all are tokenized on a worker thread: one long
#: text takes the tokenizer as long as many short ones.
TOKENIZE_ON_LOOP_CHARS = 16384


def _cheap_to_tokenize(inputs: list[Any]) -> bool:
    """Whether ``inputs`` are few and short enough to tokenize on the event loop."""
    if len(inputs) > 16:
        return False
    size = 0
    for item in inputs:
        if isinstance(item, TaskItem):
            item = item.input
        if isinstance(item, dict):
            size += sum(len(value) for value in item.values() if isinstance(value, str))
            continue
        text = item_text(item)  # a text, or an embed or tokenize item's prompt and text
        if text is None:
            return False
        size += len(text)
    return size <= TOKENIZE_ON_LOOP_CHARS


def untokenizable(exc: Exception, request_id: str) -> UnprocessableInput:
    """The 422 of inputs the model's tokenizer raised ``exc`` on. The tokenizer's own text may
    hold paths, addresses or reprs of library objects: it goes to the log under the request
    id, and the answer names only the exception's class."""
    logger.warning(
        "request %s: the model cannot tokenize its input: %s: %s",
        request_id or "-",
        type(exc).__name__,
        exc,
    )
    return UnprocessableInput(
        f"the model cannot tokenize this input ({type(exc).__name__}; request id "
        f"{request_id or '-'})"
    )


class Deadline(float):
    """The loop time by which a request must be answered, and which limit set it.

    A float, so that it goes wherever a deadline goes; :attr:`seconds` is the limit it was set
    with and :attr:`asked` whether the request's own timeout set it (lower than the model's).
    """

    seconds: float
    asked: bool

    def __new__(cls, at: float, seconds: float, asked: bool) -> Deadline:
        deadline = super().__new__(cls, at)
        deadline.seconds = seconds
        deadline.asked = asked
        return deadline


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def check_mask_token(metadata: dict[str, Any], inputs: list[Any]) -> None:
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


async def check_media_items(deployment: Deployment, inputs: list[Any]) -> None:
    """Refuse the media items (images, ...) a model cannot take, before they are queued: too
    large (413, from the header: pixels, or the memory decoding would take) or undecodable
    (400). On a worker thread: decoding an image takes milliseconds the event loop owes to
    every other request."""
    media = media_inputs(deployment.metadata)
    if not media:
        return
    several = len(deployment.metadata.get("inputs") or []) > 1
    limits = model_limits(deployment.config.media_limits, deployment.metadata)
    await asyncio.to_thread(check_media, media, several, inputs, limits)


class Deployments:
    """The deployments one app serves, by name; the first is the default.

    The collection changes at run time when models are loaded, reloaded and unloaded
    (:mod:`batching.control`): :meth:`put` and :meth:`remove` swap a name's deployment in one
    step on the event loop, so a request resolves either the old deployment or the new one.
    Resolving takes a lease on it (:mod:`batching.runtime.leases`), which the request gives
    back when it is recorded: a replaced deployment serves its leaseholders before it stops.
    """

    def __init__(self, deployments: Sequence[Deployment]) -> None:
        if not deployments:
            raise ValueError("at least one deployment is needed")
        self.by_name = {deployment.name: deployment for deployment in deployments}
        #: Repository index entries of models not served now: loading beside a served
        #: version, unloading, unloaded or failed (set by :mod:`batching.control`).
        self.others: dict[object, dict[str, str]] = {}

    def __iter__(self) -> Iterator[Deployment]:
        return iter(self.by_name.values())

    @property
    def default(self) -> Deployment:
        """The first model served: the one the routes without a model name use.

        :raises ModelNotFound: every model is unloaded.
        """
        for deployment in self.by_name.values():
            return deployment
        raise ModelNotFound("no model is loaded")

    def get(self, name: str | None, version: str | None = None) -> Deployment:
        """The deployment serving ``name`` (the default when None), at ``version`` if given;
        the running request holds it (a lease) until it is recorded.

        :raises ModelNotFound: no such model, or not that version.
        """
        if name is None:
            deployment = self.default
        else:
            found = self.by_name.get(name)
            if found is None:
                raise ModelNotFound(f"no model named {name!r} is served")
            deployment = found
            if version is not None and version != deployment.config.version:
                raise ModelNotFound(f"model {name!r} has no version {version!r}")
        deployment.leases.take()
        return deployment

    def put(self, deployment: Deployment) -> Deployment | None:
        """Serve ``deployment`` under its name from now on; the one it replaces, if any."""
        replaced = self.by_name.get(deployment.name)
        self.by_name[deployment.name] = deployment
        return replaced

    def remove(self, name: str) -> Deployment | None:
        """Stop resolving ``name``; its deployment, if it was served."""
        return self.by_name.pop(name, None)

    @property
    def ready(self) -> bool:
        """Whether every model is loaded, warm and not draining."""
        return all(deployment.ready for deployment in self.by_name.values())


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """What a model's tokenizer says about a request's inputs, one entry per input.

    Each list is None when the model cannot count (it has no ``count_tokens``).
    """

    #: Tokens the model runs: special tokens included, after truncation at its max length
    #: (its ``count_tokens``, as token-aware batching counts them).
    used: list[int] | None
    #: Tokens before truncation, counted no further than the limit asked for (its
    #: ``token_length``; its ``count_tokens`` when it has none); None when no limit was asked.
    lengths: list[int] | None


class DataPlane:
    """Resolve, deadline, submit, wait, record: what every door does with a request.

    :param deployments: the models served.
    :param metrics: where requests are counted and timed.
    """

    def __init__(self, deployments: Deployments, metrics: Metrics) -> None:
        self.deployments = deployments
        self.metrics = metrics
        self._request_counters: dict[tuple[str, int], Counter] = {}

    def deployment(self, name: str | None, version: str | None = None) -> Deployment:
        """See :meth:`Deployments.get`."""
        deployment = self.deployments.get(name, version)
        span = current_span()
        if span is not None:
            span.model(deployment.name)
        return deployment

    @staticmethod
    def now() -> float:
        """The event loop's clock, which deadlines are measured on."""
        return asyncio.get_running_loop().time()

    def deadline(self, deployment: Deployment, timeout: float | None = None) -> Deadline:
        """The loop time by which a request must be answered: the model's timeout, lowered
        (never raised) by the ``timeout`` seconds the client asked for."""
        limit = deployment.config.batching.timeout
        asked = timeout is not None and timeout < limit
        if timeout is not None:
            limit = min(limit, timeout)
        return Deadline(self.now() + limit, limit, asked)

    def refused(self, model: str, reason: str) -> None:
        """Count one request answered without a result in ``batching_rejected_total``, under
        ``reason`` (the README's table says which reason each status code is counted
        under). ``model`` is "" when the request was refused before its model was known."""
        self.metrics.rejected.labels(model, reason).inc()

    async def count_tokens(
        self,
        deployment: Deployment,
        inputs: list[Any],
        *,
        limit: int | None = None,
        request_id: str = "",
        deadline: float | None = None,
    ) -> TokenCounts:
        """Count the tokens of ``inputs`` with the model's own tokenizer, whether or not it is
        batched by tokens: for usage reports, and with ``limit`` for request limits (each
        input's length before truncation, counted no further than ``limit``).

        :param deadline: the request's, when it is to be queued next: a request the batcher
            would refuse now (overloaded, not ready, too many items) is refused before its
            tokens are counted, so that a storm of refused requests costs the loop little
            (one that passes is checked again when it is queued).
        :raises UnprocessableInput: the model cannot tokenise an input.
        :raises BatchingError: with ``deadline``, as :meth:`infer` would at admission.
        """
        hooks = await deployment.counting_hooks()
        count, length = hooks.count_tokens, hooks.token_length
        if count is None:
            return TokenCounts(None, None)
        if deadline is not None:
            deployment.batcher.admit(len(inputs), deadline=deadline)

        def counted() -> TokenCounts:
            assert count is not None
            used = [count(item) for item in inputs]
            if limit is None:
                return TokenCounts(used, None)
            if length is None:
                return TokenCounts(used, used)
            return TokenCounts(used, [length(item, limit) for item in inputs])

        try:
            if _cheap_to_tokenize(inputs):
                return counted()
            # Tokenizing a large request would hold up every other request on the loop.
            return await asyncio.to_thread(counted)
        except Exception as exc:
            failure = untokenizable(exc, request_id)
        raise failure

    async def infer(
        self,
        deployment: Deployment,
        inputs: list[Any],
        *,
        deadline: float,
        request_id: str = "",
        disconnected: Callable[[], Awaitable[None]] | None = None,
        tokens: list[int] | None = None,
        token_cap: int | None = None,
    ) -> list[Any] | None:
        """Queue ``inputs`` and wait for their outputs, in order; None when the client went
        away first (``disconnected`` returned), in which case its items are dropped before
        they reach the model, wherever they are in the queue.

        :param tokens: the inputs' ``count_tokens``, when the door has already counted them
            (:meth:`count_tokens`); counted here when the model is batched by tokens otherwise.
        :param token_cap: with ``tokens``, the padded tokens every batch these items run in
            may carry, whether or not the model is batched by tokens (outputs that grow with
            tokens, such as per-token vectors; see :meth:`Batcher.submit`).
        :raises UnprocessableInput: the model cannot take an input (a fill-mask text without
            its mask token) or cannot tokenise it.
        :raises DeadlineExceeded: not served before ``deadline``; the message says which
            limit set it and whether it passed while the request was queued or running.
        :raises BatchingError: refused at admission (see :meth:`Batcher.submit`).
        :raises InvalidRequest: the model expands its items (:mod:`batching.expansion`) and
            cannot expand one of these.
        """
        expansion = await expand_items(deployment, inputs)
        if expansion is None:
            return await self._queue(
                deployment,
                inputs,
                deadline=deadline,
                request_id=request_id,
                disconnected=disconnected,
                tokens=tokens,
                token_cap=token_cap,
            )
        # The units are counted, queued and packed like items; the door's counts were of items.
        outputs = await self._queue(
            deployment,
            expansion.units,
            deadline=deadline,
            request_id=request_id,
            disconnected=disconnected,
        )
        return None if outputs is None else expansion.answers(outputs)

    async def _queue(
        self,
        deployment: Deployment,
        inputs: list[Any],
        *,
        deadline: float,
        request_id: str = "",
        disconnected: Callable[[], Awaitable[None]] | None = None,
        tokens: list[int] | None = None,
        token_cap: int | None = None,
    ) -> list[Any] | None:
        """:meth:`infer` of units of batching (items the model takes as they are)."""
        check_mask_token(deployment.metadata, inputs)
        await check_media_items(deployment, inputs)
        if token_cap is not None and tokens is not None and len(tokens) == len(inputs):
            pass  # counted by the door, and needed for the cap whatever the model's batching
        elif deployment.count_tokens is None:
            tokens = None
        elif tokens is None or len(tokens) != len(inputs):
            failure: UnprocessableInput | None = None
            try:
                tokens = await deployment.tokens_of(inputs, offload=not _cheap_to_tokenize(inputs))
            except Exception as exc:
                failure = untokenizable(exc, request_id)
            if failure is not None:
                raise failure
        span = current_span()
        future = deployment.batcher.submit(
            inputs,
            deadline=deadline,
            tokens=tokens,
            request_id=request_id,
            token_cap=token_cap if tokens is not None else None,
            trace=span,
        )
        if span is not None:
            span.submitted(deployment.name, len(inputs), tokens)
        watcher = asyncio.ensure_future(disconnected()) if disconnected is not None else None
        waited: set[asyncio.Future[Any]] = {future} if watcher is None else {future, watcher}
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            running = future.running
            future.cancel()
            raise self._expired(deployment, deadline, running) from None
        except asyncio.CancelledError:
            # The door's own task was cancelled (its call or connection ended): the items are
            # dropped wherever they are in the queue, never computed for nobody.
            future.cancel()
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        if not future.done():
            future.cancel()
            return None
        try:
            return future.result()
        except DeadlineExceeded:
            # The batcher saw the deadline pass in the queue a moment before the timer above.
            raise self._expired(deployment, deadline, future.running) from None
        except NotReady:
            # Accepted, then its instance died or the server shut down before serving it.
            self.refused(deployment.name, "not_ready")
            raise

    def _expired(self, deployment: Deployment, deadline: float, running: bool) -> DeadlineExceeded:
        """The 504 of a request whose ``deadline`` passed, counted, saying which deadline."""
        self.refused(deployment.name, "deadline")
        if isinstance(deadline, Deadline) and deadline.asked:
            which = f"the deadline the request asked for ({_duration(deadline.seconds)})"
        else:
            limit = deployment.config.batching.timeout
            which = (
                f"the server's deadline for model {deployment.name!r} "
                f"({_duration(limit)}, --timeout-ms)"
            )
        where = "while it was running" if running else "while it was queued"
        return DeadlineExceeded(f"{which} passed {where}")

    def record(self, deployment: Deployment | None, status: int, started: float) -> None:
        """Count one answered request under ``status`` and time it from ``started``;
        ``deployment`` None: answered before its model was known (counted under model "")."""
        name = "" if deployment is None else deployment.name
        if deployment is not None:
            deployment.leases.give_back()
        key = (name, status)
        counter = self._request_counters.get(key)
        if counter is None:
            counter = self.metrics.requests.labels(name, str(status))
            self._request_counters[key] = counter
        counter.inc()
        self.metrics.request_latency.labels(name).observe(self.now() - started)
