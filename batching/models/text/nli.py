"""Zero-shot classification's request and answer, as the transformers pipeline defines them.

A request item is a text with its ``candidate_labels``, ``hypothesis_template`` and
``multi_label`` (:data:`ZERO_SHOT_PARAMETERS`, sent as a :class:`TaskItem`); each label makes
one premise/hypothesis pair, which an NLI model scores. :func:`zero_shot_answer` turns the
pairs' (contradiction, entailment) logits into ``pipeline("zero-shot-classification")``'s
answer. Which logits those are comes from the model config's ``label2id``
(:func:`nli_logit_ids`), checked at start-up.

Pure: numpy, no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np
from numpy.typing import ArrayLike

from ..parameters import InvalidParameter, Param, TaskItem
from ..tasks.zero_shot import DEFAULT_TEMPLATE, ZERO_SHOT_CLASSIFICATION

__all__ = [
    "DEFAULT_TEMPLATE",
    "ZERO_SHOT_PARAMETERS",
    "ZERO_SHOT_TASK",
    "ZeroShotAnswer",
    "ZeroShotRequest",
    "check_nli_folder",
    "nli_logit_ids",
    "zero_shot_answer",
    "zero_shot_request",
]

ZERO_SHOT_TASK = "zero-shot-classification"

#: What a request may set, by name (declared in :mod:`batching.models.tasks.zero_shot`).
ZERO_SHOT_PARAMETERS: dict[str, Param] = {param.name: param for param in ZERO_SHOT_CLASSIFICATION}


class ZeroShotAnswer(TypedDict):
    """``pipeline("zero-shot-classification")``'s answer to one text."""

    sequence: str
    labels: list[str]
    scores: list[float]


def nli_logit_ids(config: Mapping[str, object]) -> tuple[int, int]:
    """``(contradiction, entailment)``: the positions of those logits, as the pipeline finds
    them: entailment is the first ``label2id`` label starting with "entail" (any case);
    contradiction is the first logit, or the last when entailment is the first.

    :raises ValueError: the config names no entailment label, or too few labels.
    """
    label2id = config.get("label2id")
    entailment = None
    if isinstance(label2id, Mapping):
        for label, index in label2id.items():
            if str(label).lower().startswith("entail") and isinstance(index, int):
                entailment = index
                break
    if entailment is None:
        labels = ", ".join(map(str, label2id)) if isinstance(label2id, Mapping) else "none"
        raise ValueError(
            "zero-shot-classification needs an NLI model whose config.json label2id names an "
            f"entailment label (e.g. 'entailment'); this one has: {labels}"
        )
    count = len(label2id) if isinstance(label2id, Mapping) else 0
    if count < 2 or not 0 <= entailment < count:
        raise ValueError(
            "zero-shot-classification needs an NLI model with an entailment and a "
            f"contradiction logit; config.json label2id has {count} label(s)"
        )
    return (count - 1 if entailment == 0 else 0), entailment


def check_nli_folder(folder: Path) -> tuple[int, int]:
    """:func:`nli_logit_ids` of the ``config.json`` in ``folder`` (read without torch).

    :raises ValueError: unreadable, or not an NLI model.
    """
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the model's config.json: {type(exc).__name__}") from None
    if not isinstance(config, dict):
        raise ValueError("the model's config.json is not a JSON object")
    return nli_logit_ids(config)


@dataclass(frozen=True, slots=True)
class ZeroShotRequest:
    """One text with its labels, checked: what :func:`zero_shot_request` makes of an item."""

    text: str
    labels: tuple[str, ...]
    template: str
    multi_label: bool

    def hypotheses(self) -> list[str]:
        return [self.template.format(label) for label in self.labels]


def zero_shot_request(item: object) -> ZeroShotRequest:
    """The text and parameters of a request item.

    :raises InvalidParameter: no ``candidate_labels`` (a plain text has none), or a template
        that does not take the label at ``{}``.
    :raises ValueError: the input is not a text.
    """
    parameters: TaskItem = item if isinstance(item, TaskItem) else TaskItem(item)
    text = parameters.input
    if not isinstance(text, str):
        raise ValueError(
            f"zero-shot-classification takes a text to classify, not {type(text).__name__}"
        )
    labels = parameters.get("candidate_labels")
    if not labels:
        raise InvalidParameter(
            "parameter 'candidate_labels' is required by this model: the labels to score "
            'the text against, e.g. "parameters": {"candidate_labels": ["sports", "politics"]}'
        )
    template = parameters.get("hypothesis_template", DEFAULT_TEMPLATE)
    check_template(template)
    multi_label = bool(parameters.get("multi_label", False))
    return ZeroShotRequest(text, tuple(labels), template, multi_label)


def check_template(template: str) -> None:
    """:raises InvalidParameter: ``template`` holds no ``{}``, or other fields ``format``
    cannot fill with the label alone."""
    problem = None
    if "{}" not in template:
        problem = "holds no {}"
    else:
        try:
            template.format("label")
        except (IndexError, KeyError, ValueError):
            problem = "has fields other than one {} (write a literal brace as {{ or }})"
    if problem is not None:
        raise InvalidParameter(
            f"parameter 'hypothesis_template' {problem}: it must hold {{}} where each label "
            f'goes, e.g. "{DEFAULT_TEMPLATE}"'
        )


def zero_shot_answer(request: ZeroShotRequest, logits: Sequence[ArrayLike]) -> ZeroShotAnswer:
    """The pipeline's answer from each label's ``(contradiction, entailment)`` logits:
    ``{"sequence", "labels", "scores"}``, labels sorted by score, highest first.

    Several labels and not ``multi_label``: a softmax of the entailment logits over the
    labels. Otherwise each label's own softmax of entailment against contradiction.
    """
    pairs = np.asarray([np.asarray(row, dtype=np.float32) for row in logits], dtype=np.float32)
    if pairs.shape != (len(request.labels), 2):
        raise RuntimeError(
            f"expected {len(request.labels)} (contradiction, entailment) logit pairs, "
            f"got shape {pairs.shape}"
        )
    if request.multi_label or len(request.labels) == 1:
        shifted = np.exp(pairs - pairs.max(axis=-1, keepdims=True))
        scores = (shifted / shifted.sum(axis=-1, keepdims=True))[:, 1]
    else:
        entailment = pairs[:, 1]
        shifted = np.exp(entailment - entailment.max())
        scores = shifted / shifted.sum()
    order = list(reversed(scores.argsort()))
    return {
        "sequence": request.text,
        "labels": [request.labels[i] for i in order],
        "scores": scores[order].tolist(),
    }
