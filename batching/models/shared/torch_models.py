"""What the transformers-backed models share: devices, pooling, token counting, and the one
tokenise-and-run step. This package's modules are the only ones that import torch."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

if TYPE_CHECKING:  # annotations only: importing this module imports torch, not transformers
    from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase

from .text_models import (
    TokenCounter,
    calibration_texts,
    max_length_of,
    read_config,
    read_json,
    warmup_text,
)

__all__ = [
    "WEIGHTS_LOADING",
    "TokenCounter",
    "calibration_texts",
    "encode",
    "encode_and_run",
    "max_length_of",
    "mean_pool",
    "read_config",
    "read_json",
    "require_strings",
    "resolve_device",
    "task_folder",
    "to_numpy",
    "warmup_text",
]

#: Held while transformers builds a model from its weights: ``from_pretrained`` is not
#: thread-safe (while it builds a model it swaps how every ``nn.Module`` registers its
#: parameters, to the meta device), so instances loading at once on their own threads would
#: get each other's meta tensors ("Cannot copy out of meta tensor").
WEIGHTS_LOADING = threading.Lock()

_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


class AutoClass(Protocol):
    """A transformers auto class (``AutoModel``, ``AutoModelForMaskedLM``, ...)."""

    def from_pretrained(self, path: str, /) -> object: ...


def load_eval(auto_class: AutoClass, folder: Path, device: torch.device | str) -> PreTrainedModel:
    """``auto_class.from_pretrained(folder)`` (under :data:`WEIGHTS_LOADING`), in eval mode,
    on ``device``: the fp32 torch model an engine is checked against."""
    from transformers import PreTrainedModel  # the auto class has loaded it

    with WEIGHTS_LOADING:
        model = auto_class.from_pretrained(str(folder))
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"{folder.name} loads as {type(model).__name__}, not a transformers model")
    module: torch.nn.Module = model  # torch's typed methods; .to moves a module in place
    module.eval()
    module.to(device)
    return model


def task_folder(path: str | os.PathLike[str], task: str, served: str, model: str) -> Path:
    """The folder of a model ``model`` (its class's name) that serves the task ``served``,
    built for ``task``.

    :raises ValueError: another task, or a folder that does not exist."""
    if task != served:
        raise ValueError(f"{model} serves {served}, not {task!r}")
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"model folder {str(folder)!r} does not exist")
    return folder


def resolve_device(device: str) -> torch.device:
    """Check a device string ("cpu", "cuda", "cuda:N") and turn it into a ``torch.device``.

    :raises ValueError: for any other spelling, or "cpu:N".
    :raises RuntimeError: when CUDA is asked for but absent, or the index is out of range.
    """
    match = _DEVICE_RE.match(device.strip())
    if match is None:
        raise ValueError(f"device {device!r} is not one of 'cpu', 'cuda', 'cuda:N'")
    kind, index = match.group(1), match.group(2)
    if kind == "cpu":
        if index is not None:
            raise ValueError(f"device {device!r}: write 'cpu' without an index")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"device {device!r} asked for, but torch reports no usable CUDA device "
            f"(torch {torch.__version__}); use --device cpu"
        )
    ordinal = int(index) if index is not None else 0
    count = torch.cuda.device_count()
    if ordinal >= count:
        raise RuntimeError(f"device {device!r} asked for, but only {count} CUDA device(s) exist")
    return torch.device("cuda", ordinal)


def to_numpy(array: torch.Tensor) -> np.ndarray:
    # .numpy() shares memory with a CPU float32 tensor, so the common case copies nothing.
    if array.device.type != "cpu" or array.dtype != torch.float32:
        array = array.to(device="cpu", dtype=torch.float32)
    return array.numpy()


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor, sqrt_len: bool = False) -> torch.Tensor:
    """Average the token vectors over real tokens only, so padding never shifts the result."""
    weights = mask.to(hidden.dtype)
    # A batched matmul sums the masked rows without materialising hidden * mask.
    summed = torch.bmm(weights.unsqueeze(1), hidden).squeeze(1)
    counts = weights.sum(dim=1, keepdim=True).clamp(min=1e-9)
    return summed / (counts.sqrt() if sqrt_len else counts)


def encode(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    max_length: int,
    device: torch.device,
    pairs: Sequence[str] | None = None,
) -> BatchEncoding:
    """Tokenise ``texts`` (with ``pairs``, as sequence pairs), padded to the longest and
    truncated at ``max_length``, as tensors on ``device``."""
    encoded: BatchEncoding = tokenizer(
        list(texts),
        None if pairs is None else list(pairs),
        padding=True,
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
    )
    if device.type != "cpu":
        encoded = encoded.to(device)
    return encoded


def encode_and_run(
    tokenizer: PreTrainedTokenizerBase,
    run: Callable[[Mapping[str, torch.Tensor]], object],
    texts: Sequence[str],
    max_length: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenise ``texts`` (padded to the longest, truncated at ``max_length``), run them
    through ``run`` (the model's engine: its first output from the encoded batch) on
    ``device``, and return the last hidden state with the attention mask. Call it under
    ``torch.inference_mode()``."""
    encoded = encode(tokenizer, texts, max_length, device)
    hidden = torch.as_tensor(run(encoded))  # ONNX Runtime and OpenVINO answer in numpy
    return hidden, encoded["attention_mask"]


def require_strings(inputs: Sequence[object]) -> list[str]:
    """``inputs``, each checked to be a text."""
    texts = []
    for index, item in enumerate(inputs):
        if not isinstance(item, str):
            raise TypeError(f"input {index} is {type(item).__name__}, expected a string")
        texts.append(item)
    return texts
