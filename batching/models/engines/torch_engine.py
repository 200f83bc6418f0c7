"""The torch engine: the model as transformers loads it, in fp32, or with its weights cast to
bf16 (or fp16 on a GPU). Outputs come back as float32."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["DTYPES", "TorchRunner", "on_threads", "threads"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def threads() -> int:
    """The intra-op threads torch was given (``OMP_NUM_THREADS``, which server.py sets from
    the CPU budget): every engine uses as many, so the budget holds whatever runs."""
    return max(1, torch.get_num_threads())


def _tensors(inputs: Mapping[str, Any], device: Any) -> dict[str, Any]:
    """The batch as tensors on ``device``: numpy arrays (a tokenizer without torch) become
    tensors sharing their memory."""
    out = {}
    for name, value in inputs.items():
        tensor = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        out[name] = tensor if device is None or tensor.device == device else tensor.to(device)
    return out


def on_threads(runner: Any, count: int) -> Any:
    """``runner`` run with ``count`` intra-op threads: torch's own operators (the forward of a
    torch variant, the pooling after any variant) use that many while it runs."""

    def run(inputs: Mapping[str, Any]) -> Any:
        if torch.get_num_threads() != count:
            torch.set_num_threads(count)
        return runner(inputs)

    return run


class TorchRunner:
    """Runs ``model`` (loaded in fp32, in eval mode) at ``precision``; bf16 and fp16 run a
    cast copy, so the fp32 model stays the reference until it is dropped."""

    engine = "torch"

    def __init__(self, model: Any, precision: str) -> None:
        dtype = DTYPES[precision]
        self.precision = precision
        self.model = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
        try:
            self.device: Any = next(self.model.parameters()).device
        except (AttributeError, StopIteration, TypeError):
            self.device = None  # inputs are left where they are

    def __call__(self, inputs: Mapping[str, Any]) -> torch.Tensor:
        with torch.inference_mode():
            output: torch.Tensor = self.model(**_tensors(inputs, self.device))[0]
        return output if output.dtype == torch.float32 else output.float()
