"""The errors the server answers with, and the HTTP status of each (the doors answer with it).

::

    BatchingError                 base; never raised itself
    ├── ClientError               the caller must change the request
    │   ├── InvalidRequest        400  not parseable (bad JSON, wrong types, not UTF-8)
    │   ├── PermissionDenied      403  the key presented may not make this call
    │   ├── ModelNotFound         404  no such model or version
    │   ├── PayloadTooLarge       413  body or item count over the limit
    │   └── UnprocessableInput    422  well-formed, but not something this model takes
    ├── Unavailable               503  retry later; carries ``retry_after`` seconds
    │   ├── Overloaded            the queue is full or cannot finish the request in time
    │   └── NotReady              loading, warming up, restarting or draining
    ├── DeadlineExceeded          504  accepted, but not served before its deadline
    ├── InferenceFailed           500  the model raised, or broke its output contract
    ├── LoadFailed                500  a model could not be loaded at run time
    └── ClientGone                499  the client went away first: nobody to answer

The status each error is answered with (or, over gRPC, counted under) is one table, every
door's: :data:`STATUS_FOR`.
"""

from __future__ import annotations

__all__ = [
    "CLIENT_CLOSED",
    "STATUS_FOR",
    "BatchingError",
    "ClientError",
    "ClientGone",
    "DeadlineExceeded",
    "InferenceFailed",
    "InvalidRequest",
    "LoadFailed",
    "ModelNotFound",
    "NotReady",
    "Overloaded",
    "PayloadTooLarge",
    "PermissionDenied",
    "Unavailable",
    "UnprocessableInput",
    "status_of",
]


class BatchingError(Exception):
    """Base of every error the server answers with a status code."""


class ClientError(BatchingError):
    """Raised when the request itself is wrong; retrying it unchanged cannot succeed."""


class InvalidRequest(ClientError):
    """Raised when a request body cannot be parsed or does not follow the protocol."""


class PermissionDenied(ClientError):
    """Raised when the key a request presents may not make the call (a load or unload that
    needs an admin key); a missing or unknown key is refused before, at the door."""


class ModelNotFound(ClientError):
    """Raised when a request names a model or version this server does not serve."""


class PayloadTooLarge(ClientError):
    """Raised when a body or its number of items exceeds the configured limit."""


class UnprocessableInput(ClientError):
    """Raised when a well-formed request does not fit the model (wrong type, too long)."""


class Unavailable(BatchingError):
    """Raised when the server cannot take the request now; ``retry_after`` is a hint in seconds.

    ``hold`` (seconds, or None) is how long the same request, sent again on the same
    connection before ``retry_after``, is held before it is looked at: about when the queue
    could take it. It keeps clients that resend at once from spending the server's CPU on
    refusals (see ``batching.http.connections``)."""

    def __init__(self, message: str, retry_after: float = 1.0, hold: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.hold = hold


class Overloaded(Unavailable):
    """Raised at admission when the queue is full or could not serve the request in time."""


class NotReady(Unavailable):
    """Raised when the model is not loaded and warm yet, is restarting, or the server drains."""


class DeadlineExceeded(BatchingError):
    """Raised when an accepted request was not served before its deadline."""


class InferenceFailed(BatchingError):
    """Raised when the model raised on a request's items or returned the wrong output count."""


class LoadFailed(BatchingError):
    """Raised when a model cannot be loaded at run time (a load call, a poll): answered 500
    with the exception's class only; whatever served before keeps serving."""


class ClientGone(BatchingError):
    """Raised by the data plane when the client went away before its answer (its items were
    dropped wherever they were): the one place a departed client is recorded. Nothing is
    answered to it; it is counted under 499, nginx's code."""


#: Counted (and answered, to nobody) when the client hung up before its answer: nginx's code.
CLIENT_CLOSED = 499

#: The HTTP status of each error class (a subclass answers as its nearest listed class).
STATUS_FOR: dict[type[BatchingError], int] = {
    ClientGone: CLIENT_CLOSED,
    InvalidRequest: 400,
    PermissionDenied: 403,
    ModelNotFound: 404,
    PayloadTooLarge: 413,
    UnprocessableInput: 422,
    InferenceFailed: 500,
    Unavailable: 503,
    DeadlineExceeded: 504,
}


def status_of(exc: BatchingError) -> int:
    """The HTTP status of ``exc``: its nearest class in :data:`STATUS_FOR`, else 500."""
    for cls in type(exc).__mro__:
        status = STATUS_FOR.get(cls)
        if status is not None:
            return status
    return 500
