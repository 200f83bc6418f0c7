"""The OpenVINO engine: the exported graph compiled for the CPU in f32 or bf16 (its inference
precision hint), with the server's thread budget: ``INFERENCE_NUM_THREADS`` threads, one
stream, the latency hint. Numpy in, numpy out: it runs without torch.

Memory: the graph is read once and every thread count's copy (:meth:`OpenVinoRunner.on_threads`)
is compiled from that one model, so the copies share its weights (two copies from the blob
cache each mapped their own: 80 MB more for the default model). Inputs are padded to the
lengths :func:`padded_length` keeps (the output cut back): each new input shape leaves
compiled kernels and buffers behind, and traffic of every length from 1 to 256 tokens grew the
process by hundreds of MB. Up to 16 tokens every length is its own (the short sentences most
requests carry pay nothing: padding them to 16 took a third of the server's capacity on
one-sentence traffic); above, the lengths kept are an eighth of a power of two apart, so no
input computes more than an eighth more than its own tokens, and 48 lengths cover 1 to 256.

A serving runner reads the graph from OpenVINO's IR (:func:`.mapped_weights.openvino_ir`),
whose weights are mapped from the engine cache; :meth:`OpenVinoRunner.release_memory` also
drops the mapped pages the compiled copies no longer read."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import openvino

from .mapped_weights import release_pages

__all__ = ["OpenVinoRunner", "PrecisionUnavailable", "padded_length"]

_HINTS = {"fp32": "f32", "bf16": "bf16"}
#: Inputs up to this many tokens keep their own length.
EXACT_TOKENS = 16
#: The CPU plugin's cache of what it prepared per input shape (its default: 5,000 entries).
#: Bounded, the growth under traffic of many lengths halved (+3.7 / +4.2 % between 10 and 60 s
#: of load, against +7.7 / +8.4 %) with the same requests per second, on one-sentence and on
#: mixed-length traffic (docs/benchmarks.md).
RUNTIME_CACHE_ENTRIES = 20


def padded_length(length: int, most: int | None = None) -> int:
    """The length an input of ``length`` tokens is padded to: its own up to
    :data:`EXACT_TOKENS`, else the next multiple of an eighth of the power of two below it
    (17-32 by 2, 33-64 by 4, 65-128 by 8, ...); never past ``most`` (the position table)."""
    if length <= EXACT_TOKENS:
        return length
    step = 1 << ((length - 1).bit_length() - 4)
    padded = -(-length // step) * step
    return length if most is not None and padded > most else padded


class PrecisionUnavailable(RuntimeError):
    """The CPU would run the asked precision as another (OpenVINO falls back silently)."""


class OpenVinoRunner:
    engine = "openvino"

    def __init__(
        self,
        graph: Path | Any,
        precision: str,
        threads: int,
        cache: Path | None = None,
        max_tokens: int | None = None,
        weights: Path | None = None,
    ) -> None:
        """:param graph: the ONNX or IR file, or a model already read (another thread count's).
        :param cache: a folder for compiled blobs (the measuring process's variants).
        :param max_tokens: inputs are padded no longer than this (the position table).
        :param weights: the file the model's weights are mapped from (an IR's ``.bin``),
            whose pages :meth:`release_memory` drops."""
        core = openvino.Core()
        if cache is not None:
            core.set_property({"CACHE_DIR": str(cache)})
            model: Any = str(graph)
        else:
            model = core.read_model(str(graph)) if isinstance(graph, Path) else graph
        self.precision = precision
        self.max_tokens = max_tokens
        if weights is None and isinstance(graph, Path) and graph.suffix == ".xml":
            weights = graph.with_suffix(".bin")
        self.weights = weights
        #: The model read once (None: compiled from the blob cache, nothing to share).
        self.model = None if cache is not None else model
        compiled = core.compile_model(
            model,
            "CPU",
            {
                "INFERENCE_PRECISION_HINT": _HINTS[precision],
                "INFERENCE_NUM_THREADS": threads,
                "NUM_STREAMS": 1,
                "PERFORMANCE_HINT": "LATENCY",
                "CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE_ENTRIES,
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

    def on_threads(self, threads: int) -> OpenVinoRunner:
        """A copy compiled for ``threads`` threads from the same model (its weights shared)."""
        if self.model is None:
            raise RuntimeError("a runner compiled from the blob cache has no model to share")
        return OpenVinoRunner(
            self.model, self.precision, threads, None, self.max_tokens, self.weights
        )

    def release_memory(self) -> None:
        """Give back the intermediate buffers the largest batch so far left (OpenVINO
        allocates them again at the next batch), and the resident pages of the mapped
        weights (a batch maps the ones it reads again)."""
        self.compiled.release_memory()
        if self.weights is not None:
            release_pages(self.weights)

    def __call__(self, inputs: Mapping[str, Any]) -> np.ndarray:
        # numpy arrays, or CPU tensors (which numpy reads without a copy).
        feeds = {name: np.asarray(inputs[name]) for name in self.names}
        length = next(iter(feeds.values())).shape[-1] if feeds else 0
        padded = padded_length(length, self.max_tokens)
        if padded != length:  # zeros: a padding id, masked out, no segment
            widths = ((0, 0), (0, padded - length))
            feeds = {name: np.pad(value, widths) for name, value in feeds.items()}
        # infer() copies the outputs out of the request's buffers, which the next call reuses.
        request = getattr(self._requests, "request", None)
        if request is None:
            request = self._requests.request = self.compiled.create_infer_request()
        output: np.ndarray = request.infer(feeds)[self.output]
        if padded != length and output.ndim >= 2 and output.shape[1] == padded:
            output = output[:, :length]
        return output
