"""What the data plane checks of media items before it queues them, whatever the door.

A model says an input is media in its metadata entry (``"content": "image"``, see
:mod:`batching.codecs.media`); each item of that input is ``bytes`` by then. Each kind has
its check here (:data:`CHECKS`), run for every item on a worker thread before the request is
queued: a media item too large is a 413, one that cannot be decoded a 400, and neither ever
reaches, or fails, a batch. A kind with no check passes as it is.

"Too large" is by two measures for an image: its pixels (``--max-image-pixels``) and what
decoding it and preparing it for the model would take in memory (``--max-decode-bytes``),
both read from its header (:mod:`.shared.image_budget`). The second needs the model's image
processor's resize rule, which a model declares in its image input's metadata entry
(:data:`RESIZE_KEY`); :func:`model_limits` puts it beside the configured limits.

No torch, and Pillow only once an image is checked: the data plane and the settings import
this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .items import Item
from .parameters import TaskItem
from .tasks.audio import DEFAULT_MAX_SECONDS

__all__ = [
    "CHECKS",
    "DEFAULT_MAX_DECODE_BYTES",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "MAX_IMAGE_PIXELS_CAP",
    "RESIZE_KEY",
    "MediaLimits",
    "check_media",
    "media_inputs",
    "model_limits",
]

#: The default ``--max-image-pixels``: 25 megapixels, a 24 MP camera photo (6000x4000).
DEFAULT_MAX_IMAGE_PIXELS = 25_000_000
#: The highest ``--max-image-pixels`` allowed: Pillow's decompression-bomb threshold (its
#: default ``Image.MAX_IMAGE_PIXELS``), above which it warns and, at twice as many, refuses.
MAX_IMAGE_PIXELS_CAP = 89_478_485
#: The default ``--max-decode-bytes``: 128 MiB, what a 25 MP PNG takes to decode (its RGB
#: pixels alone are 100 MB in Pillow) and prepare for a model, with room to spare.
DEFAULT_MAX_DECODE_BYTES = 128 << 20
#: The key of an image input's metadata entry that holds the model's image processor's
#: resize rule (its ``size``, and its centre crop as ``crop_height``/``crop_width``).
RESIZE_KEY = "resize"


@dataclass(frozen=True, slots=True)
class MediaLimits:
    """The limits a model's media items are checked against (from its ``ModelConfig``)."""

    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    #: The longest audio, in seconds (``--max-audio-seconds``).
    max_audio_seconds: float = DEFAULT_MAX_SECONDS
    #: The most bytes one image may take to decode and prepare (``--max-decode-bytes``).
    max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES
    #: The model's image resize rule (:data:`RESIZE_KEY`), as pairs; None: the model
    #: declares none, so only the decoding is counted.
    image_resize: tuple[tuple[str, int], ...] | None = None


def model_limits(limits: MediaLimits, metadata: Mapping[str, Any]) -> MediaLimits:
    """``limits`` with the resize rule the model's metadata declares for its image input."""
    for entry in metadata.get("inputs") or []:
        if isinstance(entry, Mapping) and isinstance(entry.get(RESIZE_KEY), Mapping):
            rule = entry[RESIZE_KEY]
            pairs = tuple(sorted((str(k), v) for k, v in rule.items() if isinstance(v, int)))
            return replace(limits, image_resize=pairs)
    return limits


def _check_image(data: bytes, limits: MediaLimits, where: str) -> None:
    # Imported here: a server that serves no image model never loads Pillow.
    from .shared.imaging import check_image

    resize = None if limits.image_resize is None else dict(limits.image_resize)
    check_image(
        data, limits.max_image_pixels, where, max_bytes=limits.max_decode_bytes, resize=resize
    )


def _check_audio(data: bytes, limits: MediaLimits, where: str) -> None:
    # Imported here: a server that serves no audio model never loads libsndfile.
    from .shared.waveform import check_audio

    check_audio(data, limits.max_audio_seconds, where)


#: The check of each media kind: ``(bytes, limits, where)``, raising a 4xx error.
CHECKS: dict[str, Callable[[bytes, MediaLimits, str], None]] = {
    "image": _check_image,
    "audio": _check_audio,
}


def media_inputs(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The media inputs a model's metadata declares: ``{input name: kind}``."""
    found: dict[str, str] = {}
    for entry in metadata.get("inputs") or []:
        if isinstance(entry, Mapping):
            kind = entry.get("content")
            if isinstance(kind, str) and kind and "name" in entry:
                found[str(entry["name"])] = kind
    return found


def check_media(
    media: Mapping[str, str], several: bool, items: Sequence[Item], limits: MediaLimits
) -> None:
    """Check every media item of ``items`` (plain bytes for a model of one input, else dicts
    by input name; :class:`TaskItem` wrappers are looked into).

    :param media: :func:`media_inputs` of the model.
    :param several: the model declares several inputs (items are dicts).
    :raises BatchingError: the first item's check that fails (413 or 400), naming it.
    """
    for index, item in enumerate(items):
        value = item.input if isinstance(item, TaskItem) else item
        for name, kind in media.items():
            check = CHECKS.get(kind)
            if check is None:
                continue
            data = value.get(name) if several and isinstance(value, dict) else value
            if isinstance(data, bytes):
                check(data, limits, f"inputs[{index}]" + (f".{name}" if several else ""))
