"""glibc's allocator, told to give memory back: for ``server.py`` (or a host that opts in).

Under mixed request sizes a process's RSS creeps up for minutes: glibc raises its mmap
threshold each time a large block is freed (up to 32 MiB), so the large activation buffers of
later batches come from the heap arenas instead of fresh mappings, and the freed space stays
resident, fragmented across one arena per thread. Fixing the threshold (which also turns off
that dynamic raise) and capping the arenas keeps large buffers in mappings that go back to the
kernel when freed.

Nothing here runs on import, and :func:`create_app` never calls it: the allocator is
process-wide state, which an app embedded in someone else's server must leave alone. A host
that wants it calls :func:`tune_malloc` once, before loading models.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

__all__ = ["ARENA_MAX", "MMAP_THRESHOLD", "tune_malloc", "trim"]

logger = logging.getLogger("batching")

#: Blocks at least this large are mapped on their own and unmapped when freed.
MMAP_THRESHOLD = 1 << 20
#: Most malloc arenas (glibc's default is 8 per core).
ARENA_MAX = 2

# mallopt parameters, from glibc's malloc.h.
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def tune_malloc(
    mmap_threshold: int = MMAP_THRESHOLD, arena_max: int = ARENA_MAX, environ: bool = True
) -> bool:
    """Fix glibc's mmap threshold and cap its arenas in this process; with ``environ``, also
    set ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_ARENA_MAX`` (unless already set) so child
    processes (process instances) start with the same. False when the C library is not
    glibc (musl, macOS): nothing changed."""
    libc = _libc()
    if libc is None:
        logger.info("not glibc: the allocator is left as it is")
        return False
    ok = True
    # A variable the operator set was read by glibc at start-up: it wins.
    for variable, parameter, value in (
        ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, mmap_threshold),
        ("MALLOC_ARENA_MAX", _M_ARENA_MAX, arena_max),
    ):
        if variable in os.environ:
            continue
        ok = bool(libc.mallopt(parameter, value)) and ok
        if environ:
            os.environ[variable] = str(value)
    return ok


def trim() -> bool:
    """Give freed heap memory back to the kernel now (``malloc_trim(0)``); False if not
    glibc or nothing was released."""
    libc = _libc()
    return libc is not None and bool(libc.malloc_trim(0))
