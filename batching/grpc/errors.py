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

from batching.errors import CLIENT_CLOSED, BatchingError
from batching.errors import STATUS_FOR as HTTP_STATUS_FOR
from batching.errors import status_of as http_status_of

__all__ = ["CANCELLED", "INTERNAL", "STATUS_FOR", "status_of"]

#: Counted when the caller cancelled the call before its answer: nginx's 499, as on HTTP.
CANCELLED = CLIENT_CLOSED

#: The gRPC status code of each error class of :data:`batching.answers.STATUS_FOR`.
_CODES: dict[int, grpc.StatusCode] = {
    CANCELLED: grpc.StatusCode.CANCELLED,
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

#: An error class, the gRPC status code it is answered with, and the HTTP status it is counted as.
STATUS_FOR: dict[type[BatchingError], tuple[grpc.StatusCode, int]] = {
    cls: (_CODES[status], status) for cls, status in HTTP_STATUS_FOR.items()
}

#: Anything that is not a :class:`BatchingError`: a bug, answered without its details.
INTERNAL = (grpc.StatusCode.INTERNAL, 500)


def status_of(exc: BatchingError) -> tuple[grpc.StatusCode, int]:
    """The gRPC status code of ``exc`` and the HTTP status it counts as: its nearest class in
    :data:`STATUS_FOR`, else ``INTERNAL``."""
    status = http_status_of(exc)
    return _CODES[status], status
