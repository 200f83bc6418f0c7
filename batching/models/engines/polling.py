"""A background thread that runs ``step`` every so often until it says stop or is stopped."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["poll"]


def poll(
    step: Callable[[], bool], stopped: threading.Event, every_s: float, name: str
) -> threading.Thread:
    """Start a daemon thread ``name`` that calls ``step`` every ``every_s`` seconds until
    ``stopped`` is set or ``step`` returns False (its owner is gone)."""

    def run() -> None:
        while not stopped.wait(every_s):
            if not step():
                return

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
