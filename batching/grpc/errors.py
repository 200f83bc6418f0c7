"""The one place where errors become gRPC status codes, and the status a call is counted under.

Every call is counted in the same Prometheus request counters as HTTP, under the status code
the HTTP door would have answered, so one dashboard sees both transports.

``PayloadTooLarge`` maps to ``INVALID_ARGUMENT``, not ``RESOURCE_EXHAUSTED``: over gRPC it can
only mean more items than one request may carry, which is the request's fault and fails again
unchanged; Triton itself answers a batch over ``max_batch_size`` with ``INVALID_ARGUMENT``. A
message over ``--max-body-bytes`` never reaches the door: grpc-core answers it
``RESOURCE_EXHAUSTED`` from its length prefix (:mod:`.limits`).
"""

from __future__ import annotations

import grpc

from batching.errors import (
    BatchingError,
    ClientGone,
    DeadlineExceeded,
    InferenceFailed,
    InvalidRequest,
    ModelNotFound,
    PayloadTooLarge,
    PermissionDenied,
    Unavailable,
    UnprocessableInput,
)

__all__ = ["CANCELLED", "INTERNAL", "STATUS_FOR", "status_of"]

#: Counted when the caller cancelled the call before its answer: nginx's 499, as on HTTP.
CANCELLED = 499

#: An error class, the gRPC status code it is answered with, and the HTTP status it is counted as.
STATUS_FOR: dict[type[BatchingError], tuple[grpc.StatusCode, int]] = {
    ClientGone: (grpc.StatusCode.CANCELLED, CANCELLED),
    InvalidRequest: (grpc.StatusCode.INVALID_ARGUMENT, 400),
    PermissionDenied: (grpc.StatusCode.PERMISSION_DENIED, 403),
    ModelNotFound: (grpc.StatusCode.NOT_FOUND, 404),
    PayloadTooLarge: (grpc.StatusCode.INVALID_ARGUMENT, 413),
    UnprocessableInput: (grpc.StatusCode.INVALID_ARGUMENT, 422),
    InferenceFailed: (grpc.StatusCode.INTERNAL, 500),
    Unavailable: (grpc.StatusCode.UNAVAILABLE, 503),
    DeadlineExceeded: (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
}

#: Anything that is not a :class:`BatchingError`: a bug, answered without its details.
INTERNAL = (grpc.StatusCode.INTERNAL, 500)


def status_of(exc: BatchingError) -> tuple[grpc.StatusCode, int]:
    """The gRPC status code of ``exc`` and the HTTP status it counts as: its nearest class in
    :data:`STATUS_FOR`, else ``INTERNAL``."""
    for cls in type(exc).__mro__:
        status = STATUS_FOR.get(cls)
        if status is not None:
            return status
    return INTERNAL
