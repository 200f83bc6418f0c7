"""The ONNX Runtime engine: the exported graph (fused where ONNX Runtime's optimiser fuses
it) on the CPU, with the server's thread budget: ``intra_op_num_threads`` threads, one
inter-op thread, sequential execution; no memory arena. Numpy in, numpy out: it runs without
torch.

Every session of one graph in the process (one per thread count) adds the same mapped
initializers (:func:`.mapped_weights.ort_initializers`): one copy of the embedding tables."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime

from .mapped_weights import ort_initializers

__all__ = ["OnnxRuntimeRunner"]


class OnnxRuntimeRunner:
    engine = "onnxruntime"
    precision = "fp32"

    def __init__(self, graph: Path, threads: int) -> None:
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3  # errors only: its warnings are about graph details
        # Idle threads block instead of spinning: the event loop and the other instances
        # share these cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # No arena and no memory pattern per input shape: both keep what the largest batch of
        # each shape used (traffic of every length grew the process by ~100 MB, kept).
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = False
        #: Held while the session lives: it reads these arrays in place.
        self.shared = ort_initializers(graph)
        self.shared.add_to(options)
        self.session = onnxruntime.InferenceSession(
            str(graph), options, providers=["CPUExecutionProvider"]
        )
        self.names = [tensor.name for tensor in self.session.get_inputs()]

    def __call__(self, inputs: Mapping[str, Any]) -> np.ndarray:
        feeds = {name: np.asarray(inputs[name]) for name in self.names}
        output: np.ndarray = self.session.run(None, feeds)[0]
        return output
