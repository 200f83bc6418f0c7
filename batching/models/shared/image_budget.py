"""What decoding one image costs in memory, known from its header before a pixel is decoded,
and the plan that keeps it there.

A pixel count alone does not bound it: Pillow keeps an RGB pixel in 4 bytes, its PNG decoder
holds two rows of the file's own depth beside the image (for a 25,000,000 x 1 image, rows as
large as the image), a progressive JPEG holds every DCT coefficient (2 bytes a sample), WebP
decodes through copies of 16 bytes a pixel, and an image processor that keeps the aspect
ratio (CLIP's ``shortest_edge``) turns a 10,000 x 1 strip into a 2,240,000 x 224 array,
gigabytes, before cropping its centre. :func:`plan` reads the header (and, for a model that
declares its image processor's resize rule, :class:`Resize`) and returns a :class:`Plan`:

- a JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8: ``Image.draft``) that keeps
  :data:`GAP` times the model's input size on each axis;
- the decoded image is then converted to RGB and reduced by whole factors (``Image.reduce``,
  a box average) a tile at a time, so that its full-size RGB copy never exists, to no less
  than :data:`GAP` times what the processor resizes it to, and only that is handed over:
  Pillow's own two-step resize (``reducing_gap``), whose result its documentation calls
  indistinguishable from the direct one from a gap of 3;
- :attr:`Plan.peak` is the most memory held at once on the way, from the file's decoding to
  the processor's arrays: what a model's ``--max-decode-bytes`` is compared with.

No torch: the data plane imports this module. The per-format figures were measured with
Pillow's decoders and transformers' PIL image processors (see ``docs/security.md``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from PIL import Image, ImageMode

__all__ = [
    "GAP",
    "Plan",
    "Resize",
    "pixel_bytes",
    "plan",
    "reduce_factors",
    "reduced_size",
    "tiles",
]

#: Reduced images keep at least this many times the model's input size on each axis.
GAP = 3
#: Pixels converted to RGB and reduced at a time (a tile's copies are all that is added).
TILE_PIXELS = 1 << 20
#: Decoders that hold more than the image: whole extra copies of it (measured: WebP's decode
#: goes through an RGBA buffer and two copies; a TIFF strip may be the whole image raw). PNG
#: and JPEG are counted exactly (their rows, their coefficients); GIF and BMP decode in place.
_EXTRA_COPIES = {"PNG": 0, "JPEG": 0, "MPO": 0, "GIF": 0, "BMP": 0, "WEBP": 3}
_OTHER_COPIES = 1
#: Pillow's JPEG formats (a camera's multi-picture JPEG opens as MPO).
_JPEG = ("JPEG", "MPO")
#: Bytes an image processor holds per pixel of the image it is given (its uint8 arrays and
#: the Pillow image it resizes), per pixel of the image it resizes to (the same, before the
#: centre crop), and per pixel of what it returns (float32 copies for rescaling, normalising
#: and the tensor): transformers' PIL image processors, measured (12.5, 10 and 32).
PROCESSOR_IN_BYTES = 14
PROCESSOR_RESIZED_BYTES = 11
PROCESSOR_OUT_BYTES = 36
# PNG colour types: samples per pixel.
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def pixel_bytes(mode: str) -> int:
    """What Pillow keeps per pixel of ``mode``: 4 bytes for every mode of several bands (RGB
    too), a sample's size for one band."""
    try:
        described = ImageMode.getmode(mode)
    except KeyError:  # a mode Pillow does not describe: no pixel of Pillow's is wider
        return 4
    return 4 if len(described.bands) > 1 else int(described.typestr[-1])


@dataclass(frozen=True, slots=True)
class Resize:
    """An image processor's resize rule, as its ``size`` says it (transformers' forms): a
    fixed ``height`` and ``width``; ``shortest_edge`` (optionally capped by ``longest_edge``),
    keeping the aspect ratio; or ``max_height`` and ``max_width``, fitting inside them. Any
    other form (or none: a processor that does not resize) is taken as keeping the image's
    size, so nothing is reduced for it. ``crop_height`` and ``crop_width``: the centre crop
    that follows, if any."""

    height: int | None = None
    width: int | None = None
    shortest_edge: int | None = None
    longest_edge: int | None = None
    max_height: int | None = None
    max_width: int | None = None
    crop_height: int | None = None
    crop_width: int | None = None

    @classmethod
    def of(cls, size: Mapping[str, object] | Iterable[tuple[str, object]] | None) -> Resize:
        """The rule of a processor's ``size`` (a dict, or transformers' ``SizeDict``), with
        its crop's ``crop_height`` and ``crop_width``; other keys are ignored."""
        given = dict(size or {})
        values = {
            name: int(value)
            for name, value in ((name, given.get(name)) for name in cls.__slots__)
            if isinstance(value, int) and value > 0
        }
        return cls(**values)

    @property
    def keeps_aspect(self) -> bool:
        """Whether the output's shape follows the image's (then only one factor may reduce
        both axes, or the processor would compute another shape)."""
        fixed = bool(self.height and self.width)
        return bool(self.shortest_edge or (self.max_height and self.max_width)) or not fixed

    @property
    def resizes(self) -> bool:
        """Whether the rule is one of the forms above (else it keeps the image's size)."""
        return bool(
            self.shortest_edge
            or (self.max_height and self.max_width)
            or (self.height and self.width)
        )

    def output(self, width: int, height: int) -> tuple[int, int]:
        """``(width, height)`` the processor resizes a ``width`` x ``height`` image to, by
        transformers' own arithmetic, its forms taken in the order its PIL backend takes
        them."""
        if self.shortest_edge and self.longest_edge:
            return self._capped(width, height, self.shortest_edge, self.longest_edge)
        if self.shortest_edge:
            short, long = (width, height) if width <= height else (height, width)
            new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
            return (new_short, new_long) if width <= height else (new_long, new_short)
        if self.max_height and self.max_width:
            scale = min(self.max_height / height, self.max_width / width)
            return int(width * scale), int(height * scale)
        if self.height and self.width:
            return self.width, self.height
        return width, height

    @staticmethod
    def _capped(width: int, height: int, size: int, longest: int) -> tuple[int, int]:
        """``shortest_edge`` capped by ``longest_edge`` (``get_size_with_aspect_ratio``)."""
        low, high = float(min(height, width)), float(max(height, width))
        raw: float = size
        if high / low * size > longest:
            raw = longest * low / high
            size = int(round(raw))
        if (height <= width and height == size) or (width <= height and width == size):
            return width, height
        if width < height:
            return size, int(raw * height / width)
        return int(raw * width / height), size


@dataclass(frozen=True, slots=True)
class Plan:
    """How one image is decoded and what it costs (see the module's docstring)."""

    #: The stored image's size, ``(width, height)``.
    size: tuple[int, int]
    #: The size the processor needs of each stored axis, ``(width, height)`` (the larger of
    #: the two orientations EXIF may give); None: nothing is reduced.
    target: tuple[int, int] | None
    #: Whether one factor must reduce both axes (the processor keeps the aspect ratio).
    uniform: bool
    #: JPEG only: the size to ask its decoder for (``Image.draft``); None otherwise.
    draft: tuple[int, int] | None
    #: Bytes held while the file is decoded: all the data plane's check holds.
    decoding: int
    #: The most bytes held at once, from decoding the file to the processor's arrays.
    peak: int


def reduce_factors(
    size: tuple[int, int], target: tuple[int, int] | None, uniform: bool
) -> tuple[int, int]:
    """The whole factors that keep ``size`` at least :data:`GAP` times ``target`` per axis."""
    if target is None:
        return 1, 1
    factors = (
        max(1, size[0] // (GAP * max(1, target[0]))),
        max(1, size[1] // (GAP * max(1, target[1]))),
    )
    if uniform:
        return (min(factors),) * 2
    return factors


def reduced_size(size: tuple[int, int], factors: tuple[int, int]) -> tuple[int, int]:
    """The size ``Image.reduce`` gives (a last, partial box counts as a pixel)."""
    return -(-size[0] // factors[0]), -(-size[1] // factors[1])


def tiles(size: tuple[int, int], factors: tuple[int, int]) -> Iterable[tuple[int, int, int, int]]:
    """Boxes covering ``size``, each starting on a multiple of ``factors`` (so that reducing
    each box gives exactly the pixels reducing the whole would), of about
    :data:`TILE_PIXELS` pixels (more only when one factor box is larger)."""
    width, height = size
    fx, fy = factors
    tile_w = min(width, max(fx, TILE_PIXELS // fy // fx * fx))
    tile_h = min(height, max(fy, TILE_PIXELS // tile_w // fy * fy))
    for top in range(0, height, tile_h):
        for left in range(0, width, tile_w):
            yield left, top, min(width, left + tile_w), min(height, top + tile_h)


def plan(image: Image.Image, data: bytes, resize: Resize | None) -> Plan:
    """The plan for ``image`` (opened, its header read, not decoded) of the file ``data``,
    for a model whose processor resizes by ``resize`` (None: the model takes the bytes, so
    only the decoding is counted)."""
    size = image.size
    target = _target(size, resize)
    uniform = resize is not None and resize.keeps_aspect
    draft = None
    decoded = size
    if image.format in _JPEG and target is not None:
        draft = (GAP * target[0], GAP * target[1])
        decoded = _drafted(size, draft)
    stored = decoded[0] * decoded[1] * pixel_bytes(image.mode)
    decoding = stored * (1 + _EXTRA_COPIES.get(image.format or "", _OTHER_COPIES))
    decoding += _decoder_buffers(image, data)
    if resize is None:
        return Plan(size, None, False, draft, decoding, decoding)
    factors = reduce_factors(decoded, target, uniform)
    reduced = reduced_size(decoded, factors)
    reduced_bytes = reduced[0] * reduced[1] * 4
    tile = min(decoded[0] * decoded[1], max(TILE_PIXELS, factors[0] * factors[1]))
    reducing = stored + reduced_bytes + tile * (pixel_bytes(image.mode) + 4)
    out_w, out_h = resize.output(*reduced)
    kept_w, kept_h = min(out_w, resize.crop_width or out_w), min(out_h, resize.crop_height or out_h)
    processing = (
        reduced_bytes
        + reduced[0] * reduced[1] * PROCESSOR_IN_BYTES
        + out_w * out_h * PROCESSOR_RESIZED_BYTES
        + kept_w * kept_h * PROCESSOR_OUT_BYTES
    )
    return Plan(size, target, uniform, draft, decoding, max(decoding, reducing, processing))


def _target(size: tuple[int, int], resize: Resize | None) -> tuple[int, int] | None:
    if resize is None or not resize.resizes:
        return None
    width, height = size
    upright = resize.output(width, height)
    turned = resize.output(height, width)  # an EXIF rotation by a quarter turn
    return max(upright[0], turned[1]), max(upright[1], turned[0])


def _drafted(size: tuple[int, int], wanted: tuple[int, int]) -> tuple[int, int]:
    """The size Pillow's JPEG ``draft`` decodes ``size`` at, asked for ``wanted``."""
    scale = min(size[0] // max(1, wanted[0]), size[1] // max(1, wanted[1]))
    for factor in (8, 4, 2, 1):
        if scale >= factor:
            return -(-size[0] // factor), -(-size[1] // factor)
    return size


def _decoder_buffers(image: Image.Image, data: bytes) -> int:
    """What the format's decoder holds beside the image: a PNG's two rows (the current and
    the previous, for its filters) at the file's depth; a progressive JPEG's coefficients."""
    width, height = image.size
    if image.format == "PNG" and data[12:16] == b"IHDR":
        depth, colour = data[24], data[25]
        row = math.ceil(width * depth * _PNG_CHANNELS.get(colour, 4) / 8) + 1
        return 2 * row
    if image.format in _JPEG and (image.info.get("progressive") or image.info.get("progression")):
        # Each component's sampling factors (Pillow's ``layer``: id, horizontal, vertical, table).
        layers: list[tuple[int, int]] = [
            (int(layer[1]), int(layer[2])) for layer in getattr(image, "layer", None) or []
        ] or [(1, 1)] * len(image.getbands())
        most_h = max(h for h, _ in layers)
        most_v = max(v for _, v in layers)
        blocks = sum(
            math.ceil(width * h / most_h / 8) * math.ceil(height * v / most_v / 8)
            for h, v in layers
        )
        return blocks * 64 * 2
    return 0
