"""Every task ``--task`` accepts, and what serves each: the one declared list.

A row maps a task name to :class:`TaskRow`: the class that serves it (``module:Class``, built as
``Class(task, folder, engine=engine)`` and meeting :class:`batching.models.protocol.Model`)
and the request parameters it declares (``module:NAME`` in this package, a tuple of
:class:`~batching.models.parameters.Param`). Both are named, not imported, so reading the
table imports no torch: ``--task`` is checked, and the model repository's ``parameters``
defaults are checked against the declaration, before any weights load.

A task transformers removed gets one line naming what to use instead (transformers' own hint
kept); any other name gets the list of the served tasks. Both stop the start-up (exit 2)
before a port is bound.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batching.models.parameters import InvalidParameter, Param, Parameters
from batching.models.processors import FEATURE_EXTRACTOR, IMAGE_PROCESSOR
from batching.models.tasks.generation import pair_of

if TYPE_CHECKING:  # annotations only: the table is read before any model is imported
    from batching.models.protocol import Model

__all__ = [
    "ALIASES",
    "REMOVED",
    "TASKS",
    "TaskRow",
    "UnknownTask",
    "check_defaults",
    "declared",
    "resolve_task",
    "row_of",
    "served_tasks",
]

#: What serves the text tasks: one transformers pipeline per model.
PIPELINE = "batching.models.text.pipeline:PipelineModel"
#: What serves the generating tasks: the model's own generate, batched.
TEXT_GENERATOR = "batching.models.generation.causal:TextGenerator"
SEQ2SEQ_GENERATOR = "batching.models.generation.seq2seq:Seq2SeqGenerator"
#: What serves the audio tasks: the feature extractor and the model, batched.
AUDIO = "batching.models.audio.audio_model:AudioModel"


@dataclass(frozen=True, slots=True)
class TaskRow:
    """What serves one task.

    :param serves: ``package.module:Class``; ``Class(task, folder, engine=engine)`` builds an
        unloaded model that meets :class:`~batching.models.protocol.Model`.
    :param parameters: ``module:NAME`` of a module of this package holding the task's
        :class:`~batching.models.parameters.Param` tuple (pure data: no torch).
    :param processor: the processor a folder of this task must hold (a feature extractor or
        an image processor, :mod:`batching.models.processors`), checked before any weights
        load; None: none.
    """

    serves: str
    parameters: str
    processor: str | None = None

    def declared(self) -> tuple[Param, ...]:
        """The parameters this task takes, in the order declared."""
        module, _, name = self.parameters.partition(":")
        value = getattr(importlib.import_module(f"{__package__}.{module}"), name)
        if not isinstance(value, tuple) or not all(isinstance(p, Param) for p in value):
            raise TypeError(f"{self.parameters} is not a tuple of Param")
        return value

    def server_class(self) -> Callable[..., Model]:
        """The class that serves the task, imported now (it may import torch): built with the
        task, the folder and ``engine=`` (and the audio tasks' ``max_seconds=``)."""
        module, _, name = self.serves.partition(":")
        serving: Callable[..., Model] = getattr(importlib.import_module(module), name)
        return serving


#: The served tasks, one row each, grouped by family.
TASKS: dict[str, TaskRow] = {
    # Text, through one transformers pipeline (batching/models/text/pipeline.py).
    "feature-extraction": TaskRow(PIPELINE, "text:FEATURE_EXTRACTION"),
    "fill-mask": TaskRow(PIPELINE, "text:FILL_MASK"),
    "text-classification": TaskRow(PIPELINE, "text:TEXT_CLASSIFICATION"),
    "token-classification": TaskRow(PIPELINE, "text:TOKEN_CLASSIFICATION"),
    # Zero-shot classification: one (text, label) pair per unit of batching.
    "zero-shot-classification": TaskRow(
        "batching.models.text.zero_shot:ZeroShotModel", "zero_shot:ZERO_SHOT_CLASSIFICATION"
    ),
    # Generation, through the model's own generate (models/generation/causal.py, seq2seq.py);
    # translation_<src>_to_<tgt> is translation from one pair the model names.
    "text-generation": TaskRow(TEXT_GENERATOR, "generation:TEXT_GENERATION"),
    "summarization": TaskRow(SEQ2SEQ_GENERATOR, "generation:SUMMARIZATION"),
    "translation": TaskRow(SEQ2SEQ_GENERATOR, "generation:TRANSLATION"),
    "text2text-generation": TaskRow(SEQ2SEQ_GENERATOR, "generation:TEXT2TEXT_GENERATION"),
    # Images: bytes in, never a path or URL (batching/models/images/classifier.py, clip.py).
    "image-classification": TaskRow(
        "batching.models.images.classifier:ImageClassifier",
        "images:IMAGE_CLASSIFICATION",
        IMAGE_PROCESSOR,
    ),
    "image-text-embedding": TaskRow(
        "batching.models.images.clip:ImageTextEmbedder",
        "images:IMAGE_TEXT_EMBEDDING",
        IMAGE_PROCESSOR,
    ),
    # Audio, decoded from WAV/FLAC bytes or taken as samples (batching/models/audio/audio_model.py).
    "audio-classification": TaskRow(AUDIO, "audio:AUDIO_CLASSIFICATION", FEATURE_EXTRACTOR),
    "automatic-speech-recognition": TaskRow(
        AUDIO, "audio:AUTOMATIC_SPEECH_RECOGNITION", FEATURE_EXTRACTOR
    ),
}

#: Other names transformers gives a served task.
ALIASES: dict[str, str] = {
    "sentiment-analysis": "text-classification",
    "ner": "token-classification",
}

_CHAT = "Use the `text-generation` pipeline with a chat model instead."
_VLM = "Use the `image-text-to-text` pipeline with a vision-language chat model instead."

#: Tasks transformers removed, with its own hint (``transformers.pipelines.REMOVED_TASKS``),
#: then what this server offers instead. A row of :data:`TASKS` of the same name wins.
REMOVED: dict[str, tuple[str, str]] = {
    "question-answering": (_CHAT, "serve a chat model with --task text-generation"),
    "visual-question-answering": (_VLM, "this server does not serve image-text-to-text"),
    "vqa": (_VLM, "this server does not serve image-text-to-text"),
    "image-to-image": (
        "For image generation tasks, please use 🤗 Diffusers instead.",
        "this server does not generate images",
    ),
    "conversational": (
        "Use the `text-generation` pipeline with chat messages instead.",
        "serve a chat model with --task text-generation",
    ),
}


class UnknownTask(ValueError):
    """A task the server does not serve; the message says what to use instead."""


def served_tasks() -> list[str]:
    """Every name ``--task`` accepts (aliases included), sorted."""
    return sorted({*TASKS, *(alias for alias, task in ALIASES.items() if task in TASKS)})


def resolve_task(name: str) -> str:
    """The served task ``name`` stands for (an alias resolved).

    :raises UnknownTask: a removed task (one line naming what to use instead) or any other
        name (listing the served ones).
    """
    task = ALIASES.get(name, name)
    if task in TASKS or (pair_of(task) is not None and "translation" in TASKS):
        return task
    removed = "translation" if name.startswith("translation_") else name
    if removed in REMOVED:
        hint, instead = REMOVED[removed]
        raise UnknownTask(
            f"--task {name}: transformers 5 removed this pipeline ({hint}); {instead}. "
            f"Served tasks: {', '.join(served_tasks())}, sparse-embedding"
        )
    raise UnknownTask(
        f"--task {name} is not served; served tasks: {', '.join(served_tasks())}, sparse-embedding"
    )


def declared(task: str) -> dict[str, Param]:
    """The parameters ``task`` (a served task or alias) declares, by name."""
    return {param.name: param for param in row_of(resolve_task(task)).declared()}


def row_of(task: str) -> TaskRow:
    """The row serving ``task``, a resolved task (``translation_<src>_to_<tgt>``:
    translation's)."""
    return TASKS["translation" if pair_of(task) is not None else task]


def check_defaults(task: str, defaults: Mapping[str, object]) -> Parameters:
    """Server-wide defaults (the model repository's ``parameters`` table) checked against
    ``task``'s declaration: every key declared, every value of its type. A required parameter
    may be left to the requests.

    :raises InvalidParameter: naming the key.
    """
    params = declared(task)
    unknown = sorted(set(defaults) - set(params))
    if unknown:
        known = ", ".join(sorted(params)) or "none"
        raise InvalidParameter(f"unknown parameter {unknown[0]!r}; the {task} task takes: {known}")
    return tuple(sorted((name, params[name].check(value)) for name, value in defaults.items()))
