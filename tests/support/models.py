"""Small models that follow the :class:`batching.Model` protocol, for tests and benchmarks.

They are ordinary user models (``--model tests.support.models:CostModel``), so they exercise
the same
loading path a user's own class does.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any


class EchoModel:
    """Answers each input with ``{"input": input, "length": len(input)}``; costs nothing."""

    def __init__(self) -> None:
        self.device = ""
        self.batches: list[list[Any]] = []

    def load(self, device: str) -> None:
        self.device = device

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        self.batches.append(list(inputs))
        return [{"input": item, "length": len(str(item))} for item in inputs]

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "echo", "datatype": "BYTES", "shape": [-1]}],
        }


class CostModel(EchoModel):
    """Echo whose batch costs ``a + b * n`` seconds of wall time, like a real model's.

    ``COST_MODEL_A_MS`` and ``COST_MODEL_B_MS`` set the two terms (defaults 2 ms and 0.2 ms).
    The wait releases the GIL, as torch does while it computes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.fixed_s = float(os.environ.get("COST_MODEL_A_MS", "2")) / 1000
        self.per_item_s = float(os.environ.get("COST_MODEL_B_MS", "0.2")) / 1000

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        time.sleep(self.fixed_s + self.per_item_s * len(inputs))
        return super().predict(inputs)


class GatedModel(EchoModel):
    """Echo that blocks in ``predict`` until the test sets :attr:`gate`.

    :attr:`entered` is set each time a batch reaches ``predict``, so a test can tell that the
    instance is busy without sleeping.
    """

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        self.entered.set()
        if not self.gate.wait(timeout=30):
            raise TimeoutError("gate never opened")
        return super().predict(inputs)


class SlowLoadModel(EchoModel):
    """Echo whose ``load`` blocks until the test sets :attr:`loaded`, to observe not-ready."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded = threading.Event()

    def load(self, device: str) -> None:
        if not self.loaded.wait(timeout=30):
            raise TimeoutError("never allowed to load")
        super().load(device)


class MortalModel(EchoModel):
    """Echo whose instance dies (``SystemExit`` on its thread) on the input ``"die"``.

    :attr:`loads` counts loads across every copy, so a test can see the restart.
    """

    loads = 0

    def load(self, device: str) -> None:
        type(self).loads += 1
        super().load(device)

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        if "die" in inputs:
            raise SystemExit("the instance thread dies")
        return super().predict(inputs)


class VectorModel(EchoModel):
    """A stand-in embedder: each text becomes FP32 ``[len, first code point, 1, -1]``."""

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        import numpy as np

        self.batches.append(list(inputs))
        return np.array(
            [[len(text), ord(text[0]) if text else 0, 1.0, -1.0] for text in inputs],
            dtype=np.float32,
        )

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, 4]}],
        }


class SumModel(EchoModel):
    """A numeric model: each FP32 row of 3 values becomes its sum."""

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        import numpy as np

        rows = np.stack([np.asarray(row, dtype=np.float32) for row in inputs])
        self.batches.append(list(inputs))
        return rows.sum(axis=1, keepdims=True)

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "values", "datatype": "FP32", "shape": [-1, 3]}],
            "outputs": [{"name": "total", "datatype": "FP32", "shape": [-1, 1]}],
        }


class BrokenLoadModel(EchoModel):
    """Echo whose weights "fail to load": ``load`` raises, on a thread or in a process."""

    def load(self, device: str) -> None:
        raise OSError("model.safetensors is truncated (a stand-in for weights that fail)")
