"""Work that needs torch, done in a child process that exits: exporting, checking and timing
the engine variants (``select_engine``'s measurements), so that a server whose chosen engine
is not torch never imports torch or transformers, nor keeps their memory.

The parent pickles a callable (a model not yet loaded, and what to do with it) to a fresh
``python -m batching.models.engines.measuring_child`` on its standard input, and waits. The
child logs through the parent's formatter to the same standard error (progress shows in the server's
log) and leaves its results in the engine cache. A process that may not have children (a
daemonic instance process) runs the work itself.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["ApartFailed", "run_apart"]

logger = logging.getLogger("batching.engines")


class ApartFailed(RuntimeError):
    """The child process failed; the message has its exit status."""


def _log_setup() -> tuple[int, logging.Formatter | None]:
    """The level and formatter of the ``batching`` logger's lines (its own handler, as the
    server configures it, or the root's), for the child to log alike."""
    ours = logging.getLogger("batching")
    level = ours.getEffectiveLevel()
    for handler in [*ours.handlers, *logging.getLogger().handlers]:
        if handler.formatter is not None:
            try:
                pickle.dumps(handler.formatter)
            except Exception:
                continue
            return level, handler.formatter
    return level, None


def run_apart(work: Callable[[], Any]) -> None:
    """Run ``work()`` (picklable) in a child process and wait for it to exit.

    :raises ApartFailed: the child exited with a non-zero status (its log says why).
    """
    if multiprocessing.current_process().daemon:
        work()
        return
    payload = pickle.dumps((work, *_log_setup()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.run(
        [sys.executable, "-m", "batching.models.engines.measuring_child"],
        input=payload,
        # Its stdout to stderr as well: a process instance's stdout carries its replies.
        stdout=2,
        env=env,
        check=False,
    )
    if child.returncode != 0:
        raise ApartFailed(f"the measuring process exited with status {child.returncode}")


def _child() -> int:
    work, level, formatter = pickle.loads(sys.stdin.buffer.read())
    handler = logging.StreamHandler(sys.stderr)
    if formatter is not None:
        handler.setFormatter(formatter)
    ours = logging.getLogger("batching")
    ours.handlers[:] = [handler]
    ours.setLevel(level)
    ours.propagate = False
    try:
        work()
    except Exception:
        logger.exception("measuring the engines failed")
        return 1
    return 0


def _exit(status: int) -> None:
    """Leave without the interpreter's teardown: freeing torch's, transformers' and the
    engines' objects one by one took seconds of a fresh start on 2 cores, and the work's
    results are files in the engine cache, written and closed by then."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    _exit(_child())
