"""What decoding one media item costs in resident memory, measured in a fresh interpreter
(``tests/support/peak_memory.py``): the peak it adds above the level before it.

Images go through the project's own steps, as a served model runs them: the data plane's
check (:func:`check_image` with the default budget) and the model's preparation
(:func:`image_inputs`: decode, reduce, the ViT image processor at 224 x 224). Before the decode
budget the same steps cost, for the 25,000,000 x 1 greyscale PNG, +75 MB (check) and +698 MB
(preparation); for a 5000 x 5000 RGB PNG +100 MB and +348 MB. Audio goes through
:func:`decode` (to 16 kHz) and :func:`check_audio`; before it, a 30 s, 8-channel, 384 kHz FLAC
cost +99 MB either way."""

from __future__ import annotations

import pytest

from tests.support.peak_memory import peak_bytes

pytestmark = pytest.mark.slow

MB = 1_000_000

_IMAGE = """
import io
import torch
import transformers
from PIL import Image
from batching.models.shared.image_budget import Resize, plan
from batching.models.images.classifier import image_inputs, resize_of
from batching.models.shared.imaging import check_image, sample_png
from batching.models.media import DEFAULT_MAX_DECODE_BYTES, DEFAULT_MAX_IMAGE_PIXELS

processor = transformers.ViTImageProcessor()
rule = resize_of(processor)
buffer = io.BytesIO()
{build}
data = buffer.getvalue()
del image
with Image.open(io.BytesIO(data)) as opened:
    print("ESTIMATE", plan(opened, data, Resize.of(rule)).peak)
image_inputs(processor, [sample_png()], torch.device("cpu"))
check_image(sample_png(), DEFAULT_MAX_IMAGE_PIXELS, max_bytes=DEFAULT_MAX_DECODE_BYTES, resize=rule)
"""

_PREPARE = 'pixels = image_inputs(processor, [data], torch.device("cpu"))["pixel_values"]'
_CHECK = (
    "check_image(data, DEFAULT_MAX_IMAGE_PIXELS, max_bytes=DEFAULT_MAX_DECODE_BYTES, resize=rule)"
)

#: The 25,000,000 x 1 greyscale PNG of the report: 24 KB on the wire.
_STRIP = 'image = Image.new("L", (25_000_000, 1), 128)\nimage.save(buffer, format="PNG")'
_SQUARE = (
    'image = Image.merge("RGB", [Image.linear_gradient("L").resize((5000, 5000))] * 3)\n'
    'image.save(buffer, format="{form}")'
)


@pytest.mark.parametrize("work", [_CHECK, _PREPARE], ids=["check", "prepare"])
def test_a_25_megapixel_strip_costs_at_most_100_mb_to_check_or_prepare(work: str) -> None:
    cost = peak_bytes(_IMAGE.format(build=_STRIP), work)
    # The greyscale pixels are 25 MB and the PNG decoder's two rows 25 MB each.
    assert cost <= 100 * MB, cost / MB


@pytest.mark.parametrize(
    ("form", "most"),
    [("PNG", 115 * MB), ("JPEG", 35 * MB)],
)
def test_a_5000_by_5000_image_costs_its_stated_figure_to_prepare(form: str, most: int) -> None:
    # PNG: its RGB pixels alone are 100 MB in Pillow (4 bytes each), all the rest is reduced
    # first. JPEG: decoded at a quarter of its size (1250 x 1250) by the DCT scaling.
    cost = peak_bytes(_IMAGE.format(build=_SQUARE.format(form=form)), _PREPARE)
    assert cost <= most, cost / MB


_AUDIO = """
import io
import numpy as np
import soundfile
from batching.models.shared.waveform import check_audio, decode, sine_wav

rate, seconds, channels, form = {rate}, {seconds}, {channels}, "{form}"
frames = int(rate * seconds)
samples = np.zeros((frames, channels), dtype=np.int16)
samples[:, 0] = (3000 * np.sin(np.arange(frames) * (2 * np.pi * 440 / rate))).astype(np.int16)
buffer = io.BytesIO()
soundfile.write(buffer, samples, rate, format=form, subtype="PCM_16")
data = buffer.getvalue()
del samples
decode(sine_wav(44_100), 16_000, 30.0)
check_audio(sine_wav(44_100), 30.0)
"""


@pytest.mark.parametrize(
    ("rate", "seconds", "channels", "form"),
    [(384_000, 30.0, 8, "FLAC"), (384_000, 0.2, 256, "WAV")],
    ids=["30s-8ch-384kHz-flac", "256ch-384kHz-wav"],
)
@pytest.mark.parametrize(
    "work",
    ["wave = decode(data, 16_000, 30.0)", "check_audio(data, 30.0)"],
    ids=["decode", "check"],
)
def test_audio_costs_what_the_model_hears_not_what_the_file_holds(
    rate: int, seconds: float, channels: int, form: str, work: str
) -> None:
    cost = peak_bytes(_AUDIO.format(rate=rate, seconds=seconds, channels=channels, form=form), work)
    # One block of 1 MiB, the soxr stream, and at most 30 s of mono at 16 kHz (1.9 MB).
    assert cost <= 12 * MB, cost / MB
