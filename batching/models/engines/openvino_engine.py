"""The OpenVINO engine: the exported graph compiled for the CPU in f32 or bf16 (its inference
precision hint), with the server's thread budget: ``INFERENCE_NUM_THREADS`` threads, one
stream, the latency hint. Compiled blobs are cached beside the export. Numpy in, numpy out:
it runs without torch."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import openvino

__all__ = ["OpenVinoRunner", "PrecisionUnavailable"]

_HINTS = {"fp32": "f32", "bf16": "bf16"}


class PrecisionUnavailable(RuntimeError):
    """The CPU would run the asked precision as another (OpenVINO falls back silently)."""


class OpenVinoRunner:
    engine = "openvino"

    def __init__(self, graph: Path, precision: str, threads: int, cache: Path | None) -> None:
        core = openvino.Core()
        if cache is not None:
            core.set_property({"CACHE_DIR": str(cache)})
        self.precision = precision
        compiled = core.compile_model(
            str(graph),
            "CPU",
            {
                "INFERENCE_PRECISION_HINT": _HINTS[precision],
                "INFERENCE_NUM_THREADS": threads,
                "NUM_STREAMS": 1,
                "PERFORMANCE_HINT": "LATENCY",
            },
        )
        actual = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        if actual != _HINTS[precision]:
            raise PrecisionUnavailable(
                f"this CPU runs OpenVINO {precision} as {actual}, so it is not a variant"
            )
        self.compiled = compiled
        self.names = [tensor.get_any_name() for tensor in compiled.inputs]
        self.output = compiled.outputs[0]
        # One infer request per calling thread: copies of the model share this runner
        # (:mod:`.shared`), each on its own instance thread.
        self._requests = threading.local()

    def release_memory(self) -> None:
        """Give back the intermediate buffers the largest batch so far left (OpenVINO
        allocates them again at the next batch)."""
        self.compiled.release_memory()

    def __call__(self, inputs: Mapping[str, Any]) -> np.ndarray:
        # numpy arrays, or CPU tensors (which numpy reads without a copy).
        feeds = {name: np.asarray(inputs[name]) for name in self.names}
        # infer() copies the outputs out of the request's buffers, which the next call reuses.
        request = getattr(self._requests, "request", None)
        if request is None:
            request = self._requests.request = self.compiled.create_infer_request()
        output: np.ndarray = request.infer(feeds)[self.output]
        return output
