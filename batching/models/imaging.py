"""Image bytes, read with Pillow in-process: their size from the header alone, then decoded.

:func:`check_image` is what the data plane asks of every image item before it is queued
(:mod:`.media`): the header gives the size without decoding the pixels (Pillow's
``Image.open`` is lazy), so an image over the pixel limit is refused (413) before any pixel is
decoded, and Pillow's own decompression-bomb warning is an error here, never a warning in the
log. Then the image is decoded once, so that bytes Pillow cannot read are refused (400)
before they can fail the batch they would join. :func:`decode_image` is what a model calls:
the same decode, turned upright by its EXIF orientation and converted to RGB, as
``transformers.image_utils.load_image`` does for a PIL image. Bytes only: no path, no URL.

No torch: the data plane imports this module.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from PIL import Image, ImageOps, UnidentifiedImageError

from batching.errors import InvalidRequest, PayloadTooLarge

__all__ = ["PILLOW_MAX_PIXELS", "check_image", "decode_image", "image_size", "sample_png"]

#: Pillow's decompression-bomb threshold: it warns above this many pixels and refuses above
#: twice as many; ``MAX_IMAGE_PIXELS_CAP`` (:mod:`.media`) keeps the server's limit below it.
PILLOW_MAX_PIXELS: int = Image.MAX_IMAGE_PIXELS or 89_478_485

# What Pillow raises for bytes it cannot read, in open (header) or load (pixels).
_UNREADABLE = (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, IndexError)


@contextmanager
def _opened(data: bytes, max_pixels: int, where: str) -> Iterator[Image.Image]:
    """The image of ``data`` with only its header read, checked against ``max_pixels``."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise PayloadTooLarge(
                f"{where} is an image of more than {max_pixels} pixels, this model's limit"
            ) from None
        except _UNREADABLE:
            raise InvalidRequest(
                f"{where} is not an image this server can decode (PNG, JPEG, WebP, GIF, BMP, "
                "TIFF, ...)"
            ) from None
    with image:
        width, height = image.size
        if width * height > max_pixels:
            raise PayloadTooLarge(
                f"{where} is an image of {width}x{height} = {width * height} pixels; this "
                f"model takes at most {max_pixels}"
            )
        yield image


def image_size(data: bytes, max_pixels: int = PILLOW_MAX_PIXELS) -> tuple[int, int]:
    """``(width, height)`` from the header alone, no pixel decoded."""
    with _opened(data, max_pixels, "the image") as image:
        return image.size


def check_image(data: bytes, max_pixels: int, where: str = "the image") -> None:
    """Refuse image bytes a model cannot take: over ``max_pixels`` (read from the header,
    before decoding), or not decodable.

    :raises PayloadTooLarge: over the limit, or a decompression bomb by Pillow's measure.
    :raises InvalidRequest: bytes Pillow cannot decode (unknown format, truncated, corrupt).
    """
    with _opened(data, max_pixels, where) as image:
        try:
            image.load()
        except _UNREADABLE:
            raise InvalidRequest(f"{where} is a damaged or truncated image") from None


def decode_image(data: bytes, max_pixels: int = PILLOW_MAX_PIXELS) -> Image.Image:
    """The RGB image of ``data``, upright by its EXIF orientation.

    :raises PayloadTooLarge: over ``max_pixels``.
    :raises InvalidRequest: bytes Pillow cannot decode.
    """
    with _opened(data, max_pixels, "the image") as image:
        try:
            upright = ImageOps.exif_transpose(image)
            return (upright if upright is not None else image).convert("RGB")
        except _UNREADABLE:
            raise InvalidRequest("the image is damaged or truncated") from None


def sample_png(width: int = 64, height: int = 48) -> bytes:
    """A small generated PNG (a colour gradient): what a warm-up sends through the decoder,
    the processor and the model."""
    image = Image.new("RGB", (width, height))
    image.putdata(
        [
            (x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), (x + y) % 256)
            for y in range(height)
            for x in range(width)
        ]
    )
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
