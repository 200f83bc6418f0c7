"""The model protocol: the one seam between the batching core and whatever computes.

A model object is built once per instance, loaded on that instance's device, and then
called only from that instance's dedicated thread (or process), one batch at a time.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["DEFAULT_MODEL_NAME", "Model", "build_model", "load_model_class", "warmup_batches"]


@runtime_checkable
class Model(Protocol):
    """What the server needs of a model.

    ``load(device)`` places the model on ``device`` ("cpu", "cuda:0", ...).
    ``predict(inputs)`` takes a list of inputs and returns exactly one output per input, in
    order. Outputs are JSON-serialisable values or numpy arrays (a 2-D array counts as one row
    per input).

    Optional methods, looked up with ``getattr``:

    - ``warmup_inputs(max_batch_size) -> list[list[input]]``: batches to run before the
      instance reports ready (defaults to :func:`warmup_batches`).
    - ``count_tokens(input) -> int``: the padded length this input costs, for token-aware
      batching of text models.
    """

    def load(self, device: str) -> None: ...

    def predict(self, inputs: list[Any]) -> Sequence[Any]: ...


def warmup_batches(sample: Any, max_batch_size: int) -> list[list[Any]]:
    """The default warm-up: one batch of 1 and one of ``max_batch_size``."""
    sizes = sorted({1, max_batch_size})
    return [[sample] * size for size in sizes]


def load_model_class(spec: str) -> type[Any]:
    """Import ``package.module:Name`` and return ``Name``.

    :raises ValueError: when ``spec`` is not of that form or the name cannot be imported.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"model {spec!r} is not of the form package.module:Name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r}: {exc}") from exc
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None
    return target


#: The name the default model is served under.
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


def build_model(source: str | None, task: str | None) -> Model:
    """Build an unloaded model from a CLI/config ``source``.

    ``package.module:Name`` is a user's class, instantiated with no arguments; anything else
    (None for the default model, or a local folder) goes to the transformers runner, imported
    only now so that the batching core never imports torch.
    """
    if source and ":" in source and not os.path.isdir(source):
        return load_model_class(source)()
    from . import hf

    return hf.build_model(source, task)
