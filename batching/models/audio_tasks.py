"""What the audio tasks are, known without loading anything: their names, the request
parameters each takes, the media they take and the limits on it (pure data: no torch, no
numpy), for the settings, the doors and :mod:`.audio` alike."""

from __future__ import annotations

from .parameters import Param

__all__ = [
    "ASR",
    "AUDIO_TASKS",
    "CLASSIFY",
    "CONTENT",
    "DEFAULT_MAX_SECONDS",
    "MAX_RATE",
    "MEDIA_TYPES",
    "MIN_RATE",
    "audio_parameters",
]

ASR = "automatic-speech-recognition"
CLASSIFY = "audio-classification"
#: The audio tasks.
AUDIO_TASKS = (CLASSIFY, ASR)
#: What the metadata's input entry says the model takes: media bytes of this kind.
CONTENT = "audio"
#: The media types a door takes as a raw body for an audio model.
MEDIA_TYPES = ("audio/wav", "audio/x-wav", "audio/wave", "audio/flac", "audio/x-flac")
#: The longest audio an input may hold, in seconds, unless the server says otherwise
#: (``--max-audio-seconds``): Whisper's window, and what a CTC model's attention over every
#: frame handles at a full batch in a few GiB.
DEFAULT_MAX_SECONDS = 30.0
#: Sampling rates taken, in Hz: telephone audio to studio audio.
MIN_RATE = 1_000
MAX_RATE = 384_000
_FUNCTIONS = ("softmax", "sigmoid", "none")


def audio_parameters(task: str, rate: int) -> dict[str, Param]:
    """The request parameters ``task`` takes, for a model that hears ``rate`` Hz. Each one is
    batch-neutral: it acts before the forward pass (resampling) or after it."""
    params = [
        Param(
            "sampling_rate",
            "integer",
            default=rate,
            minimum=MIN_RATE,
            maximum=MAX_RATE,
            batch_neutral=True,
            doc="the rate of samples sent as numbers (a v2 FP32 tensor); a file's own "
            "header gives its rate",
        )
    ]
    if task == CLASSIFY:
        params += [
            Param(
                "top_k",
                "integer",
                minimum=1,
                batch_neutral=True,
                doc="how many labels to return, best first; default: every label, as the "
                "pipeline does",
            ),
            Param(
                "function_to_apply",
                "string",
                choices=_FUNCTIONS,
                batch_neutral=True,
                doc="softmax, sigmoid or none; default: sigmoid for a multi-label model, none "
                "for regression, softmax otherwise",
            ),
        ]
    return {param.name: param for param in params}
