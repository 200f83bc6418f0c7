"""How one model's requests are queued, batched and admitted: validated once, at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_BATCH_TOKENS",
    "MAX_ITEMS_PER_REQUEST",
    "MAX_QUEUE_SIZE",
    "MAX_TIMEOUT",
    "POLICIES",
    "BatchingConfig",
]

POLICIES = ("fixed", "adaptive")

# The bounds of every setting that sizes something, wherever it comes from (flags, the model
# repository, a load call's config): far above what a model is served with, low enough that
# no setting can make the server allocate without end. The warm-up runs a batch of
# max_batch_size items, and the engines are measured at it.

#: The largest ``max_batch_size``.
MAX_BATCH_SIZE = 1024
#: The largest ``max_batch_tokens``.
MAX_BATCH_TOKENS = 1 << 20
#: The largest ``max_queue_size``.
MAX_QUEUE_SIZE = 1 << 16
#: The largest ``max_items_per_request``.
MAX_ITEMS_PER_REQUEST = 1 << 16
#: The longest ``timeout`` and ``max_latency``, in seconds (a day).
MAX_TIMEOUT = 86400.0


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """How one model's requests are queued, batched and admitted.

    Times are in seconds. Names follow Triton's, which operators already know.
    """

    #: Most items in one batch; a request with more is split across consecutive batches.
    max_batch_size: int = 32
    #: Longest a forming batch waits for more items, from its oldest job's enqueue time.
    max_queue_delay: float = 0.002
    #: Batch sizes that go out at once while the window is still open (Triton's semantics).
    preferred_batch_sizes: tuple[int, ...] = ()
    #: Cap on padded tokens (items x longest input) per batch, for text models; None: no cap.
    max_batch_tokens: int | None = None
    #: "fixed" (the window above) or "adaptive" (a window chosen from traffic and batch cost).
    policy: str = "fixed"
    #: The adaptive policy's latency budget: waiting never pushes a batch past it.
    max_latency: float = 0.1
    #: Most items waiting in the queue; past it requests get 503 at once.
    max_queue_size: int = 2048
    #: The breaker, once open, closes again when the queue falls to this fraction of its bound.
    queue_close_ratio: float = 0.5
    #: Default deadline of a request; a request may only lower it.
    timeout: float = 30.0
    #: Most items one request may carry.
    max_items_per_request: int = 1024

    def __post_init__(self) -> None:
        _within("max_batch_size", self.max_batch_size, MAX_BATCH_SIZE)
        if not (0 <= self.max_queue_delay < self.timeout):
            raise ValueError("max_queue_delay must be >= 0 and below timeout")
        for size in self.preferred_batch_sizes:
            if not 1 <= size <= self.max_batch_size:
                raise ValueError(
                    f"preferred_batch_sizes: {size} is not between 1 and max_batch_size "
                    f"({self.max_batch_size})"
                )
        if self.max_batch_tokens is not None:
            _within("max_batch_tokens", self.max_batch_tokens, MAX_BATCH_TOKENS)
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {self.policy!r}")
        if not 0 < self.max_latency <= MAX_TIMEOUT:
            raise ValueError(f"max_latency must be > 0 and at most {MAX_TIMEOUT:g} s")
        _within("max_queue_size", self.max_queue_size, MAX_QUEUE_SIZE)
        if not 0 <= self.queue_close_ratio <= 1:
            raise ValueError("queue_close_ratio must be between 0 and 1")
        if not (0 < self.timeout <= MAX_TIMEOUT and math.isfinite(self.timeout)):
            raise ValueError(
                f"timeout must be a positive number of seconds, at most {MAX_TIMEOUT:g}"
            )
        _within("max_items_per_request", self.max_items_per_request, MAX_ITEMS_PER_REQUEST)


def _within(name: str, value: int, most: int) -> None:
    if not 1 <= value <= most:
        raise ValueError(f"{name} must be between 1 and {most}, not {value}")
