"""The model protocol: the one seam between the batching core and whatever computes.

A model object is built once per instance, loaded on that instance's device, and then
called only from that instance's dedicated thread (or process), one batch at a time.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "DEFAULT_MODEL_NAME",
    "Model",
    "build_model",
    "load_model",
    "load_model_class",
    "warmup_batches",
]


@runtime_checkable
class Model(Protocol):
    """What the server needs of a model.

    ``load(device)`` places the model on ``device`` ("cpu", "cuda:0", ...). A model that
    wants to know which instance it is (to pick a port, a shard, a log name) declares a
    parameter named ``instance_index``: ``load(self, device, instance_index=0)``; the server
    then calls ``load(device, instance_index=i)``, where ``i`` is the instance's position in
    the model's device list (0, 1, ...; stable across restarts). A ``load(device)`` without
    that parameter is called as before; ``**kwargs`` alone does not opt in, since it often
    forwards to a loader that would reject the unknown keyword.

    ``predict(inputs)`` takes a list of inputs and returns exactly one output per input, in
    order. Outputs are JSON-serialisable values or numpy arrays (a 2-D array counts as one row
    per input).

    Optional methods, looked up with ``getattr``:

    - ``warmup_inputs(max_batch_size) -> list[list[input]]``: batches to run before the
      instance reports ready (build them with :func:`warmup_batches`). Its items are also
      the samples a configured warm-up (``warmup.batch_sizes``) repeats to each size.
    - ``count_tokens(input) -> int``: the padded length this input costs, for token-aware
      batching of text models.
    - ``metadata() -> dict``: v2-style ``inputs``/``outputs`` descriptions. The first
      input's datatype and shape (``[-1, ...]``, batch dimension first) also tell the
      "zero" and "random" warm-ups what to generate: texts for BYTES (the default), nested
      lists of numbers for a numeric type with a fixed shape.
    - ``max_seq_length`` (attribute): the longest text input in tokens; the "random"
      warm-up writes that many words.

    A model served by process instances is built in a child process: its class must be
    importable by module name, and its outputs and exceptions picklable.
    """

    def load(self, device: str) -> None: ...

    def predict(self, inputs: list[Any]) -> Sequence[Any]: ...


def load_model(model: Model, device: str, instance_index: int) -> None:
    """Call ``model.load(device)``, adding ``instance_index`` when ``load`` declares it."""
    if _declares(model.load, "instance_index"):
        model.load(device, instance_index=instance_index)  # type: ignore[call-arg]
    else:
        model.load(device)


def _declares(function: Any, name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False  # builtins and some C extensions have no introspectable signature
    parameter = parameters.get(name)
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


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
