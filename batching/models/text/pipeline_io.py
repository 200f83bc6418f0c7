"""What goes into a transformers pipeline call and what comes out, for the text tasks
(:mod:`batching.models.text.pipeline`): an input without its request's parameters, text pairs,
parameters as the pipeline takes them, each item post-processed with its own parameters in one
shared call, and the outputs made plain JSON."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol, TypeGuard

import numpy as np
import torch

from ..parameters import TaskItem

__all__ = [
    "TextPipeline",
    "classifiable",
    "input_of",
    "is_one_per_input",
    "jsonable",
    "labels_of",
    "per_item_postprocess",
    "pipeline_value",
    "pair_of",
]


class TextPipeline(Protocol):
    """What this package calls of a text task's ``transformers.Pipeline`` (whose methods are
    untyped): one call for a batch, its parameters sorted into the three steps, and the step
    that makes one output of a model output."""

    def __call__(
        self, inputs: Sequence[object], *, batch_size: int, **kwargs: object
    ) -> object: ...

    def _sanitize_parameters(
        self, **parameters: object
    ) -> tuple[Mapping[str, object], Mapping[str, object], Mapping[str, object]]: ...

    def postprocess(self, model_outputs: object, **parameters: object) -> object: ...


def jsonable(value: object) -> object:
    """Pipelines return numpy and torch values inside lists and dicts: make them plain JSON."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    return value


def input_of(item: object) -> object:
    """The input of ``item`` without its request's parameters."""
    return item.input if isinstance(item, TaskItem) else item


def pipeline_value(value: object) -> object:
    """A checked parameter as the pipeline takes it (a list where it was a tuple)."""
    return list(value) if isinstance(value, tuple) else value


@contextlib.contextmanager
def per_item_postprocess(pipe: TextPipeline, own: Sequence[Mapping[str, object]]) -> Iterator[None]:
    """Within the block, ``pipe`` post-processes its n-th output with ``own[n]`` over the call's
    own arguments: a pipeline post-processes its outputs one by one, in input order, so items
    with different post-processing parameters share one forward pass. The instance's
    attribute shadows the class's method, on this instance's own thread only."""
    original = pipe.postprocess
    each = iter(own)

    def postprocess(model_outputs: object, **params: object) -> object:
        return original(model_outputs, **{**params, **next(each)})

    setattr(pipe, "postprocess", postprocess)  # noqa: B010 (an instance attribute shadows it)
    try:
        yield
    finally:
        delattr(pipe, "postprocess")


def pair_of(item: Mapping[object, object]) -> tuple[str, str | None] | None:
    """``(text, text_pair)`` of a pair input ``{"text": a, "text_pair": b}`` (``text_pair``
    optional), or None when ``item`` is not one."""
    text, pair = item.get("text"), item.get("text_pair")
    if set(item) - {"text", "text_pair"} or not isinstance(text, str):
        return None
    if pair is not None and not isinstance(pair, str):
        return None
    return text, pair


def classifiable(item: object) -> str | dict[str, str]:
    """An input as the text-classification pipeline takes it: a text, or a pair dict."""
    if isinstance(item, str):
        return item
    pair = pair_of(item) if isinstance(item, dict) else None
    if pair is None:
        raise TypeError(
            f"text-classification takes a text or {{'text': ..., 'text_pair': ...}} of texts, "
            f"not {type(item).__name__}"
        )
    text, text_pair = pair
    return text if text_pair is None else {"text": text, "text_pair": text_pair}


def labels_of(config: Mapping[str, object]) -> list[str]:
    """The classifier's labels in the order of its logits, from ``id2label``."""
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        return []
    try:
        by_index = {int(index): str(label) for index, label in id2label.items()}
    except (TypeError, ValueError):
        return []
    if sorted(by_index) != list(range(len(by_index))):
        return []
    return [by_index[index] for index in range(len(by_index))]


def is_one_per_input(outputs: object, count: int) -> TypeGuard[list[object]]:
    return isinstance(outputs, list) and len(outputs) == count
