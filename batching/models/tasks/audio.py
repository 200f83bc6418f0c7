"""The audio tasks served by :mod:`batching.models.audio.audio_model`, known without loading
anything: the request parameters each declares, the media they take and the limits on it (pure
data: no torch, no numpy), for the task table, the settings, the doors and the model alike.

Every parameter is batch-neutral: it acts before the forward pass (resampling samples sent as
numbers) or after it (which labels, how scored), so requests that set different ones share a
batch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from batching.models.parameters import Param

from .text import FUNCTION_TO_APPLY, top_k

__all__ = [
    "ASR",
    "AUDIO_CLASSIFICATION",
    "AUDIO_TASKS",
    "AUTOMATIC_SPEECH_RECOGNITION",
    "CLASSIFY",
    "CONTENT",
    "DEFAULT_MAX_SECONDS",
    "MAX_RATE",
    "MIN_RATE",
    "check_audio_folder",
]

ASR = "automatic-speech-recognition"
CLASSIFY = "audio-classification"
#: The audio tasks.
AUDIO_TASKS = (CLASSIFY, ASR)
#: What the metadata's input entry says the model takes: media bytes of this kind.
CONTENT = "audio"
#: The longest audio an input may hold, in seconds, unless the server says otherwise
#: (``--max-audio-seconds``): Whisper's window, and what a CTC model's attention over every
#: frame handles at a full batch in a few GiB.
DEFAULT_MAX_SECONDS = 30.0
#: Sampling rates taken, in Hz: telephone audio to studio audio.
MIN_RATE = 1_000
MAX_RATE = 384_000

SAMPLING_RATE = Param(
    "sampling_rate",
    "integer",
    minimum=MIN_RATE,
    maximum=MAX_RATE,
    batch_neutral=True,
    doc="the rate, in Hz, of samples sent as numbers (a v2 FP32 tensor); default: the model's "
    "own (its metadata's sampling_rate); a file's header gives a file's rate",
)

AUTOMATIC_SPEECH_RECOGNITION = (SAMPLING_RATE,)

AUDIO_CLASSIFICATION = (
    SAMPLING_RATE,
    top_k("how many labels to answer, best first (default: every label, as the pipeline does)"),
    replace(
        FUNCTION_TO_APPLY,
        doc="how logits become scores (default: the model's problem type decides: sigmoid for "
        "multi-label, none for regression, softmax otherwise)",
    ),
)


def check_audio_folder(folder: Path, task: str) -> None:
    """Refuse, before any weights load, a folder speech recognition cannot serve: a model that
    is neither CTC nor Whisper (other seq2seq speech models are not served). That the folder
    holds a feature extractor is the task table's check (:mod:`batching.models.processors`).

    :raises ValueError: one line saying what is wrong.
    """
    if task != ASR:
        return
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # transformers says what is wrong with it when it loads
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if isinstance(architectures, list) and architectures:
        name = str(architectures[0])
        if not name.endswith("ForCTC") and name != "WhisperForConditionalGeneration":
            raise ValueError(
                f"{folder.name} holds {name}: --task {task} serves CTC models (such as "
                "Wav2Vec2ForCTC, HubertForCTC) and Whisper; other seq2seq speech models are "
                "not served"
            )
