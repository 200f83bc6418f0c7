"""User classes whose outputs name their version, for model control's tests: a request whose
outputs came from two versions shows it in every item.

Each class's gates are class attributes a test sets (instances are built by the server from
``--model tests.support.versions:VersionOne``), and reset with :func:`reset`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np


class VersionModel:
    """Answers each text with ``"<VERSION>:<text>"``."""

    VERSION = "0"
    #: When set, ``load`` waits for it (the version stays LOADING).
    load_gate: threading.Event | None = None
    #: When set, ``predict`` waits for it (a batch stays running).
    predict_gate: threading.Event | None = None
    #: Set each time a batch reaches ``predict``.
    entered: threading.Event = threading.Event()
    #: How many times a copy began to load (each class counts its own).
    loads = 0
    #: Set when a copy begins to load.
    began: threading.Event = threading.Event()
    #: How many copies were unloaded (their ``unload`` hook ran; each class counts its own).
    unloads = 0
    #: Set when a copy's ``unload`` ran.
    unloaded: threading.Event = threading.Event()

    def load(self, device: str) -> None:
        type(self).loads += 1
        type(self).began.set()
        gate = type(self).load_gate
        if gate is not None and not gate.wait(timeout=60):
            raise TimeoutError("never allowed to load")

    def unload(self) -> None:
        type(self).unloads += 1
        type(self).unloaded.set()

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        type(self).entered.set()
        gate = type(self).predict_gate
        if gate is not None and not gate.wait(timeout=60):
            raise TimeoutError("gate never opened")
        return [f"{self.VERSION}:{item}" for item in inputs]

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "version", "datatype": "BYTES", "shape": [-1]}],
        }


class VersionOne(VersionModel):
    VERSION = "1"
    entered = threading.Event()
    began = threading.Event()
    unloaded = threading.Event()


class VersionTwo(VersionModel):
    VERSION = "2"
    entered = threading.Event()
    began = threading.Event()
    unloaded = threading.Event()


class BrokenVersion(VersionModel):
    """A version whose weights "fail to load"; its message holds a path, never answered."""

    VERSION = "3"

    def load(self, device: str) -> None:
        raise OSError("/srv/models/secret/model.safetensors is truncated")


class HeavyModel(VersionModel):
    """A version that holds :data:`HEAVY_BYTES` of weights once loaded (written, so resident)."""

    VERSION = "heavy"

    def load(self, device: str) -> None:
        self.weights = np.ones(HEAVY_BYTES // 8, dtype=np.float64)


#: What :class:`HeavyModel` holds: far above the 10 % an unload may leave behind.
HEAVY_BYTES = 384 << 20


def reset() -> None:
    for cls in (VersionModel, VersionOne, VersionTwo, BrokenVersion, HeavyModel):
        cls.load_gate = None
        cls.predict_gate = None
        cls.loads = 0
        cls.unloads = 0
    for version in (VersionOne, VersionTwo):
        version.entered.clear()
        version.began.clear()
        version.unloaded.clear()
