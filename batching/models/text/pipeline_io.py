"""What goes into a transformers pipeline call and what comes out, for the text tasks
(:mod:`batching.models.text.pipeline`): an input without its request's parameters, text pairs,
parameters as the pipeline takes them, each item post-processed with its own parameters in one
shared call, and the outputs made plain JSON."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..parameters import TaskItem

__all__ = [
    "classifiable",
    "input_of",
    "is_one_per_input",
    "jsonable",
    "labels_of",
    "per_item_postprocess",
    "pipeline_value",
    "pair_of",
]


def jsonable(value: Any) -> Any:
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


def input_of(item: Any) -> Any:
    """The input of ``item`` without its request's parameters."""
    return item.input if isinstance(item, TaskItem) else item


def pipeline_value(value: Any) -> Any:
    """A checked parameter as the pipeline takes it (a list where it was a tuple)."""
    return list(value) if isinstance(value, tuple) else value


@contextlib.contextmanager
def per_item_postprocess(pipe: Any, own: list[dict[str, Any]]) -> Iterator[None]:
    """Within the block, ``pipe`` post-processes its n-th output with ``own[n]`` over the call's
    own arguments: a pipeline post-processes its outputs one by one, in input order, so items
    with different post-processing parameters share one forward pass. The instance's
    attribute shadows the class's method, on this instance's own thread only."""
    original = pipe.postprocess
    each = iter(own)

    def postprocess(model_outputs: Any, **params: Any) -> Any:
        return original(model_outputs, **{**params, **next(each)})

    pipe.postprocess = postprocess
    try:
        yield
    finally:
        del pipe.postprocess


def pair_of(item: dict[Any, Any]) -> tuple[str, str | None] | None:
    """``(text, text_pair)`` of a pair input ``{"text": a, "text_pair": b}`` (``text_pair``
    optional), or None when ``item`` is not one."""
    text, pair = item.get("text"), item.get("text_pair")
    if set(item) - {"text", "text_pair"} or not isinstance(text, str):
        return None
    if pair is not None and not isinstance(pair, str):
        return None
    return text, pair


def classifiable(item: Any) -> Any:
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


def labels_of(config: dict[str, Any]) -> list[str]:
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


def is_one_per_input(outputs: Any, count: int) -> bool:
    return isinstance(outputs, list) and len(outputs) == count
