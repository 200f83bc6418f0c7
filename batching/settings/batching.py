"""The batching flags: how each model's requests are batched and admitted (the batch cap and
window, preferred sizes, the token cap, the adaptive policy, the queue, the deadline), read
into the core's :class:`~batching.core.batching_config.BatchingConfig`. With
``--model-repository`` they are the defaults of the keys a model's ``config.toml`` leaves out."""

from __future__ import annotations

import argparse

from batching.model_config import POLICIES, BatchingConfig

from .flags import Parser, one_line

__all__ = ["add_batching_flags", "read_batching"]


def add_batching_flags(parser: Parser) -> None:
    defaults = BatchingConfig()
    parser.flags(
        [
            (
                "--max-batch-size",
                defaults.max_batch_size,
                "most items per batch; larger requests are split across batches",
            ),
            (
                "--max-queue-delay-ms",
                defaults.max_queue_delay * 1000,
                "longest a forming batch waits for more items, from its oldest item's arrival",
            ),
            (
                "--preferred-batch-sizes",
                "",
                "comma list of batch sizes that go out at once (Triton's preferred_batch_size)",
            ),
        ]
    )
    parser.flag(
        "--max-batch-tokens",
        type=int,
        help="cap on padded tokens (items x longest) per batch, for text models",
    )
    parser.flag(
        "--batching",
        default=defaults.policy,
        choices=POLICIES,
        help="fixed window, or a window adapted to traffic and measured batch cost",
    )
    parser.flags(
        [
            (
                "--max-latency-ms",
                defaults.max_latency * 1000,
                "adaptive batching's latency budget: waiting never exceeds it",
            ),
            (
                "--max-queue-size",
                defaults.max_queue_size,
                "most items queued per model; beyond it requests get 503 at once",
            ),
            (
                "--timeout-ms",
                defaults.timeout * 1000,
                "request deadline; X-Request-Timeout-Ms may lower it; past it: 504",
            ),
            (
                "--max-items-per-request",
                defaults.max_items_per_request,
                "most inputs one request may carry (413 beyond)",
            ),
        ]
    )


def read_batching(args: argparse.Namespace) -> BatchingConfig:
    """The batching flags, checked by :class:`BatchingConfig`.

    :raises BadSetting: a value out of its bounds, or sizes that are not a list of numbers.
    """
    with one_line():
        return BatchingConfig(
            max_batch_size=int(args.max_batch_size),
            max_queue_delay=float(args.max_queue_delay_ms) / 1000,
            preferred_batch_sizes=_sizes(str(args.preferred_batch_sizes)),
            max_batch_tokens=None if args.max_batch_tokens is None else int(args.max_batch_tokens),
            policy=str(args.batching),
            max_latency=float(args.max_latency_ms) / 1000,
            max_queue_size=int(args.max_queue_size),
            timeout=float(args.timeout_ms) / 1000,
            max_items_per_request=int(args.max_items_per_request),
        )


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(
            f"--preferred-batch-sizes must be a comma list of numbers: {text!r}"
        ) from None
