"""The cyclic garbage collector, set for a server process once its models are loaded.

Two measured stalls of the event loop, and what prevents each:

- The model, torch and transformers are millions of objects that live as long as the process.
  Left to the collector, each full collection walks all of them while holding the GIL:
  ~200 ms every few seconds under load. :func:`gc.freeze` takes them out of its sight.
- Under overload the loop answers thousands of requests a second, and at any instant hundreds
  of them are in flight. With CPython's default young-generation threshold (700 allocations)
  the young generation is collected hundreds of times a second, every in-flight request's
  objects survive a few of those and are promoted, and the oldest generation fills with
  objects that die soon after: a full collection then ran every ~3 s and took 5-54 ms, the
  tail of every answer (503 p99 34 ms at 5x capacity; ``benchmarks/gc_pauses.py`` logs them).
  A threshold of :data:`YOUNG_THRESHOLD` lets request-scoped objects die young, by reference
  count, before a collection ever sees them: no full collection ran in 30 s of the same
  overload, one young collection took over 2 ms (9 ms), and the 503 p99 fell to 6-7 ms
  (``BATCHING_GC_YOUNG=20000`` with that script gave 6-19 ms).

Both change the whole process, so only the server's own entry points (``server.py``, the Ray
replica) call :func:`settle_loaded_objects`; an app embedded in another host leaves them as the
host set them.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "release_unloaded_objects", "settle_loaded_objects"]

#: Allocations (net of frees) between two young-generation collections, once serving.
YOUNG_THRESHOLD = 50_000


def settle_loaded_objects() -> None:
    """Freeze everything loaded so far, and collect the young generation less often (never
    more often than it was set to)."""
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)


def release_unloaded_objects() -> None:
    """Give back the memory of a model that was unloaded or replaced at run time: its objects
    were frozen with everything else once it loaded, so the collector must see them again to
    free their cycles (one full collection, a stall like those above, once per unload); then
    the allocator returns the freed heap to the kernel, and what is left is frozen again."""
    from .allocator import trim

    gc.unfreeze()
    gc.collect()
    trim()
    gc.freeze()
