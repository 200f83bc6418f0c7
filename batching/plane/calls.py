"""One request as the data plane runs it: who asks (:class:`Caller`, what the door knows),
the deployment it resolved to, and the deadline the data plane set (:class:`Call`).

A door builds its :class:`Caller` when the request arrives: its request id, the timeout the
client asked for (a header, a parameter, a gRPC deadline), and how to tell that the client
went away. The data plane turns it into a :class:`Call`: the deadline is the model's timeout,
lowered (never raised) by the client's, counted from the request's arrival.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from batching.errors import DeadlineExceeded
from batching.metrics import Metrics
from batching.runtime.deployment import Deployment

__all__ = ["Call", "Caller", "Deadline", "loop_time"]


def loop_time() -> float:
    """The event loop's clock, which deadlines are measured on."""
    return asyncio.get_running_loop().time()


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks, as the door knows them."""

    request_id: str = ""
    #: Seconds the client asked to be answered within (None: the model's timeout).
    timeout: float | None = None
    #: Returns once the client has gone away (None: the door cannot tell; a gRPC call is
    #: cancelled instead).
    disconnected: Callable[[], Awaitable[None]] | None = None
    #: When the request arrived (the event loop's clock): its deadline counts from there.
    arrived: float = field(default_factory=loop_time)

    def within(self, seconds: float | None) -> Caller:
        """This caller, asking to be answered within ``seconds`` too (the lower of the two
        timeouts; None: no more than it asked)."""
        if seconds is None or (self.timeout is not None and self.timeout <= seconds):
            return self
        return replace(self, timeout=seconds)


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

    @classmethod
    def of(cls, deployment: Deployment, timeout: float | None, since: float) -> Deadline:
        """The model's timeout from ``since``, lowered (never raised) by the ``timeout``
        seconds the client asked for."""
        limit = deployment.config.batching.timeout
        asked = timeout is not None and timeout < limit
        if timeout is not None:
            limit = min(limit, timeout)
        return cls(since + limit, limit, asked)


@dataclass(frozen=True, slots=True)
class Call:
    """One request to one deployment: its caller, its deadline, and where its refusals are
    counted."""

    deployment: Deployment
    caller: Caller
    deadline: Deadline
    metrics: Metrics

    @property
    def request_id(self) -> str:
        return self.caller.request_id

    def refused(self, reason: str) -> None:
        """Count this request as answered without a result, under ``reason``."""
        self.metrics.child(self.metrics.rejected, self.deployment.name, reason).inc()

    def expired(self, running: bool) -> DeadlineExceeded:
        """The 504 of this request once its deadline passed, counted, saying which deadline
        and where the request was."""
        self.refused("deadline")
        deadline = self.deadline
        if deadline.asked:
            which = f"the deadline the request asked for ({_duration(deadline.seconds)})"
        else:
            which = (
                f"the server's deadline for model {self.deployment.name!r} "
                f"({_duration(deadline.seconds)}, --timeout-ms)"
            )
        where = "while it was running" if running else "while it was queued"
        return DeadlineExceeded(f"{which} passed {where}")


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"
