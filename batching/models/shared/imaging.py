"""Image bytes, read with Pillow in-process: their size from the header alone, then decoded.

:func:`check_image` is what the data plane asks of every image item before it is queued
(:mod:`..media`): the header gives the size without decoding the pixels (Pillow's
``Image.open`` is lazy), so an image over the pixel limit is refused (413) before any pixel is
decoded, and Pillow's own decompression-bomb warning is an error here, never a warning in the
log. The header also gives what decoding and preparing the image will cost in memory
(:mod:`.image_budget`): more than the model's budget is a 413 too, still before any pixel is
decoded. Then the image is decoded once (at the reduced scale a JPEG allows, holding its bytes
in the process's :data:`~.memory_gate.DECODES` budget), so that bytes Pillow cannot read are
refused (400) before they can fail the batch they would join.

:func:`decode_image` is what a model calls: the same decode, reduced toward the model's input
size before it is converted (:class:`~.image_budget.Resize`), turned upright by its EXIF
orientation and converted to RGB, as ``transformers.image_utils.load_image`` does for a PIL
image. Bytes only: no path, no URL.

No torch: the data plane imports this module.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext

from PIL import Image, UnidentifiedImageError

from batching.errors import InvalidRequest, PayloadTooLarge

from .image_budget import Plan, Resize, plan, reduce_factors, reduced_size, tiles
from .memory_gate import DECODES

__all__ = ["PILLOW_MAX_PIXELS", "check_image", "decode_image", "image_size", "sample_png"]

#: Pillow's decompression-bomb threshold: it warns above this many pixels and refuses above
#: twice as many; ``MAX_IMAGE_PIXELS_CAP`` (:mod:`..media`) keeps the server's limit below it.
PILLOW_MAX_PIXELS: int = Image.MAX_IMAGE_PIXELS or 89_478_485

# What Pillow raises for bytes it cannot read, in open (header) or load (pixels).
_UNREADABLE = (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, IndexError)
#: EXIF orientations (2-8) and the transposition that turns such an image upright, as
#: ``ImageOps.exif_transpose`` applies them.
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_ORIENTATION = 0x0112
_MB = 1_000_000


def _header(data: bytes, max_pixels: int, where: str) -> Image.Image:
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
    width, height = image.size
    if width * height > max_pixels:
        image.close()
        raise PayloadTooLarge(
            f"{where} is an image of {width}x{height} = {width * height} pixels; this "
            f"model takes at most {max_pixels}"
        )
    return image


@contextmanager
def _opened(data: bytes, max_pixels: int, where: str) -> Iterator[Image.Image]:
    """:func:`_header`, closed when the block ends."""
    with _header(data, max_pixels, where) as image:
        yield image


def image_size(data: bytes, max_pixels: int = PILLOW_MAX_PIXELS) -> tuple[int, int]:
    """``(width, height)`` from the header alone, no pixel decoded."""
    with _opened(data, max_pixels, "the image") as image:
        return image.size


def check_image(
    data: bytes,
    max_pixels: int,
    where: str = "the image",
    *,
    max_bytes: int | None = None,
    resize: Mapping[str, object] | None = None,
) -> None:
    """Refuse image bytes a model cannot take: over ``max_pixels``, or costing more than
    ``max_bytes`` to decode and prepare for a processor that resizes by ``resize`` (both
    read from the header, before decoding), or not decodable.

    :raises PayloadTooLarge: over a limit, or a decompression bomb by Pillow's measure.
    :raises InvalidRequest: bytes Pillow cannot decode (unknown format, truncated, corrupt).
    """
    with _opened(data, max_pixels, where) as image:
        planned = plan(image, data, None if resize is None else Resize.of(resize))
        _within(planned, image, max_bytes, where)
        gate = nullcontext() if max_bytes is None else DECODES.reserve(planned.decoding, max_bytes)
        with gate:
            _load(image, planned, where)


def decode_image(
    data: bytes, max_pixels: int = PILLOW_MAX_PIXELS, resize: Mapping[str, object] | None = None
) -> Image.Image:
    """The RGB image of ``data``, upright by its EXIF orientation; reduced by whole factors
    toward the size a processor that resizes by ``resize`` makes of it, never below
    :data:`~.image_budget.GAP` times that size (None: the full size).

    :raises PayloadTooLarge: over ``max_pixels``.
    :raises InvalidRequest: bytes Pillow cannot decode.
    """
    image = _header(data, max_pixels, "the image")
    planned = plan(image, data, None if resize is None else Resize.of(resize))
    _load(image, planned, "the image")
    try:
        turn = _UPRIGHT.get(image.getexif().get(_ORIENTATION, 1))
        rgb = _reduced_rgb(image, reduce_factors(image.size, planned.target, planned.uniform))
    except _UNREADABLE:
        raise InvalidRequest("the image is damaged or truncated") from None
    return rgb if turn is None else rgb.transpose(turn)


def _within(planned: Plan, image: Image.Image, max_bytes: int | None, where: str) -> None:
    if max_bytes is None or planned.peak <= max_bytes:
        return
    width, height = planned.size
    raise PayloadTooLarge(
        f"{where} is a {width}x{height} {image.format} image ({image.mode}) that would take "
        f"about {-(-planned.peak // _MB)} MB to decode and prepare for this model; it takes "
        f"images of at most {max_bytes // _MB} MB (--max-decode-bytes)"
    )


def _load(image: Image.Image, planned: Plan, where: str) -> None:
    """Decode the pixels (a JPEG at the scale ``planned`` allows)."""
    try:
        if planned.draft is not None:
            image.draft(None, planned.draft)
        image.load()
    except _UNREADABLE:
        raise InvalidRequest(f"{where} is a damaged or truncated image") from None


def _reduced_rgb(image: Image.Image, factors: tuple[int, int]) -> Image.Image:
    """``image`` converted to RGB and reduced by ``factors``, a tile at a time (each tile's
    conversion is all that is held beside the image)."""
    if factors == (1, 1):
        return image if image.mode == "RGB" else image.convert("RGB")
    out = Image.new("RGB", reduced_size(image.size, factors))
    for box in tiles(image.size, factors):
        part = image.crop(box).convert("RGB").reduce(factors)
        out.paste(part, (box[0] // factors[0], box[1] // factors[1]))
    return out


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
