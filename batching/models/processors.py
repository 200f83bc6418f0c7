"""Where a model folder keeps the feature extractor or image processor an audio or image task
needs, as transformers 5 reads it: the entry of ``processor_config.json`` (a processor saved
whole, such as ``Wav2Vec2Processor(...).save_pretrained``, nests its feature extractor or
image processor there, and writes no ``preprocessor_config.json``), else
``preprocessor_config.json`` (one saved alone).

Pure (no transformers): the start-up refuses a folder that has neither before any weights
load; the models themselves load theirs through transformers' own Auto classes (in their
pipelines, or ``AutoImageProcessor``), which read the folder the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = [
    "FEATURE_EXTRACTOR",
    "IMAGE_PROCESSOR",
    "PREPROCESSOR_FILE",
    "PROCESSOR_FILE",
    "check_processor",
    "missing_processor",
    "processor_settings",
]

#: The kinds of processor a task may need.
FEATURE_EXTRACTOR = "feature_extractor"
IMAGE_PROCESSOR = "image_processor"
#: A feature extractor or image processor saved alone.
PREPROCESSOR_FILE = "preprocessor_config.json"
#: A processor saved whole: its parts' settings nested under their kinds.
PROCESSOR_FILE = "processor_config.json"

#: The entries of ``processor_config.json`` transformers reads for each kind, in its order.
_ENTRIES: dict[str, tuple[str, ...]] = {
    FEATURE_EXTRACTOR: ("feature_extractor", "audio_processor"),
    IMAGE_PROCESSOR: ("image_processor",),
}
_NAMES = {FEATURE_EXTRACTOR: "feature extractor", IMAGE_PROCESSOR: "image processor"}


def _read(path: Path) -> object:
    try:
        with path.open(encoding="utf-8") as handle:
            document: object = json.load(handle)
    except (OSError, ValueError):
        return None
    return document


def processor_settings(folder: Path, kind: str) -> dict[str, object] | None:
    """The settings of ``folder``'s processor of ``kind`` (:data:`FEATURE_EXTRACTOR` or
    :data:`IMAGE_PROCESSOR`), from where transformers takes them; None when it has none.

    A ``preprocessor_config.json`` that cannot be read counts as there (``{}``): transformers
    says what is wrong with it when it loads."""
    if kind not in _ENTRIES:
        raise ValueError(f"unknown processor kind {kind!r}")
    nested = _read(folder / PROCESSOR_FILE)
    if isinstance(nested, dict):
        for key in _ENTRIES[kind]:
            entry = nested.get(key)
            if isinstance(entry, dict):
                return entry
    if (folder / PREPROCESSOR_FILE).is_file():
        alone = _read(folder / PREPROCESSOR_FILE)
        return alone if isinstance(alone, dict) else {}
    return None


def missing_processor(folder: Path, kind: str, task: str) -> str:
    """The one line refusing ``folder`` for ``task``, which needs a processor of ``kind``."""
    return (
        f"{folder.name} has neither {PREPROCESSOR_FILE} nor {PROCESSOR_FILE} with its "
        f"{kind} entry: --task {task} needs the model's {_NAMES[kind]}; save it (or the "
        "model's processor) beside the weights with save_pretrained"
    )


def check_processor(folder: Path, kind: str, task: str) -> dict[str, object]:
    """``folder``'s processor settings of ``kind``, which ``task`` needs.

    :raises ValueError: one line naming both files, when the folder has neither.
    """
    settings = processor_settings(folder, kind)
    if settings is None:
        raise ValueError(missing_processor(folder, kind, task))
    return settings
