"""What the engine selection needs of a model, whatever its task (:class:`EngineJob`): how to
load it, what its batches look like, and what its accuracy check compares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .engine_options import EngineOptions

__all__ = ["EngineJob"]


@dataclass(frozen=True, slots=True)
class EngineJob:
    """What :func:`~.selection.select_engine` needs of a model, whatever its task.

    :param folder: the model folder (exported, and hashed for the cache key).
    :param head: what is exported (a key of ``export.HEADS``).
    :param measure: the accuracy measure (``accuracy.MEASURES``); None: the task has none,
        and only torch at fp32 can serve it.
    :param device: "cpu" or "cuda:N".
    :param input_names: the tokenizer's tensors, in order (the exported graph's inputs).
    :param load_reference: loads the model in fp32 on ``device``, in eval mode.
    :param view: what the accuracy check compares, from a runner's output and its batch
        (pooled vectors, scores, logits at the masks), as a numpy array.
    :param calibration: the calibration batches, encoded.
    :param sample: an encoded batch of n warm-up items, for timing.
    :param reference_mb: the memory the fp32 model took, when it was loaded before the job.
    :param measure_apart: measures in a child process that exits (``measure_apart(force)``
        runs :func:`~.selection.measure_engines` there; ``force`` measures again over a
        cached decision); None: measured in this process.
    :param check_tokenizer: in the measuring process, whether the folder's ``tokenizer.json``
        tokenises as transformers does (None if so, else what differs); kept in the cache.
    """

    options: EngineOptions
    folder: Path
    head: str
    measure: str | None
    device: str
    input_names: tuple[str, ...] | Callable[[], tuple[str, ...]]
    load_reference: Callable[[], Any]
    view: Callable[[Any, Any], np.ndarray]
    calibration: Callable[[], Sequence[Any]]
    sample: Callable[[int], Any]
    reference_mb: float | None = None
    measure_apart: Callable[[bool], None] | None = None
    check_tokenizer: Callable[[], str | None] | None = None

    def names(self) -> tuple[str, ...]:
        names = self.input_names
        return names if isinstance(names, tuple) else names()
