"""User classes whose ``load`` never returns, for the shutdown tests: ``python server.py
--model tests.support.stuck:StuckLoad`` (thread instances, so one process holds them all).

:class:`StuckLoad` says on stderr when its ``load`` has begun (the test reads the line), then
waits on an event nothing sets. :class:`Fails` raises from its ``load``: a failed start with
another load still waiting.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any

#: What :class:`StuckLoad` prints once its ``load`` has begun.
STUCK_LINE = "stuck-load: load began and will never return"

#: Set once a :class:`StuckLoad` is inside its ``load``.
stuck = threading.Event()
#: Never set.
_never = threading.Event()


class StuckLoad:
    def load(self, device: str) -> None:
        stuck.set()
        print(STUCK_LINE, file=sys.stderr, flush=True)
        _never.wait()

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        return list(inputs)


class Fails(StuckLoad):
    def load(self, device: str) -> None:
        raise OSError("model.safetensors is truncated (a stand-in for weights that fail)")
