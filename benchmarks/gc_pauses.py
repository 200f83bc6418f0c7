"""``python server.py``, with every garbage collection that pauses it for 2 ms or more logged.

Run it in place of the server, under a load, and read the pauses from the server's log: one
``gc-pause`` line each (generation, milliseconds, objects collected), from start-up on, so the
collections of the model's load come first and those under the load after the ``ready:`` line.

    python -m load_test.overload --server-cmd "{python} benchmarks/gc_pauses.py"
    BATCHING_GC_YOUNG=700 python -m load_test.overload \
        --server-cmd "{python} benchmarks/gc_pauses.py"
    # then: grep gc-pause load_test_results/overload-server.log

``BATCHING_GC_YOUNG`` replaces the young-generation threshold the server sets once loaded
(:data:`batching.runtime.collector.YOUNG_THRESHOLD`), to compare settings.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import batching.runtime.collector as collector  # noqa: E402

#: Pauses shorter than this are not logged.
SHORTEST_MS = 2.0

_started: list[float] = [0.0]


def _timed(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    paused_ms = (time.perf_counter() - _started[0]) * 1000
    if paused_ms >= SHORTEST_MS:
        print(
            f"gc-pause generation {info['generation']} {paused_ms:.1f} ms "
            f"collected {info['collected']}",
            file=sys.stderr,
            flush=True,
        )


def main() -> None:
    young = os.environ.get("BATCHING_GC_YOUNG")
    if young:
        collector.YOUNG_THRESHOLD = int(young)
        # settle_loaded_objects never lowers a threshold: start from CPython's own.
        gc.set_threshold(min(700, int(young)), *gc.get_threshold()[1:])
    gc.callbacks.append(_timed)
    sys.argv = [str(ROOT / "server.py"), *sys.argv[1:]]
    runpy.run_path(str(ROOT / "server.py"), run_name="__main__")


if __name__ == "__main__":
    main()
