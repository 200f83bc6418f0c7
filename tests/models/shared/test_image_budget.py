"""The decode budget of images: its estimate read from the header (the processor's resize
rule as transformers computes it, each decoder's own buffers), the refusal before decoding,
the reduction toward the model's size (tile by tile, exactly what reducing the whole gives)
and how far it leaves the processor's input from the full-size one; the gate that holds the
data plane's concurrent decodes to the budget; and the setting on every surface."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from PIL import Image, ImageOps
from transformers.image_transforms import get_resize_output_image_size, get_size_with_aspect_ratio
from transformers.image_utils import ChannelDimension, get_image_size_for_max_height_width

from batching.errors import PayloadTooLarge
from batching.model_config import ModelConfig
from batching.models.images.classifier import image_inputs, resize_of
from batching.models.media import DEFAULT_MAX_DECODE_BYTES, MediaLimits, model_limits
from batching.models.shared import image_budget, imaging
from batching.models.shared.image_budget import Resize, plan
from batching.models.shared.imaging import check_image, decode_image
from batching.models.shared.memory_gate import MemoryGate
from batching.settings.cli import parse_settings
from batching.settings.reloads import apply_overrides
from batching.settings.repository import load_repository

MB = 1_000_000
SIZES = [(640, 480), (480, 640), (1000, 1), (1, 1000), (224, 224), (3001, 1999), (7, 5000)]


def _encoded(image: Image.Image, form: str = "PNG", **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=form, **options)
    return buffer.getvalue()


def _photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """Smooth colour waves with a little noise: what a photo's pixels look like."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    waves = np.stack(
        [
            127 + 100 * np.sin(x / (width / 7)),
            127 + 100 * np.cos(y / (height / 5)),
            127 + 80 * np.sin((x + y) / (width / 3)),
        ],
        axis=-1,
    )
    pixels = np.clip(waves + rng.normal(0, 8, waves.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def test_the_resize_rule_gives_the_sizes_transformers_resizes_to() -> None:
    for width, height in SIZES:
        array = np.empty((height, width, 3), dtype=np.uint8)
        want = get_resize_output_image_size(
            array, 224, default_to_square=False, input_data_format=ChannelDimension.LAST
        )
        assert Resize(shortest_edge=224).output(width, height) == (want[1], want[0])
        capped = get_size_with_aspect_ratio((height, width), 224, 300)
        assert Resize(shortest_edge=224, longest_edge=300).output(width, height) == (
            capped[1],
            capped[0],
        )
        fitted = get_image_size_for_max_height_width((height, width), 200, 300)
        rule = Resize(max_height=200, max_width=300)
        assert rule.output(width, height) == (fitted[1], fitted[0])
        assert Resize(height=32, width=48).output(width, height) == (48, 32)
        assert Resize().output(width, height) == (width, height)


def test_a_processors_rule_is_read_from_its_size_and_crop() -> None:
    vit = transformers.ViTImageProcessor()
    assert resize_of(vit) == {"height": 224, "width": 224}
    clip = transformers.CLIPImageProcessor(
        size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}
    )
    assert resize_of(clip) == {"shortest_edge": 224, "crop_height": 224, "crop_width": 224}
    assert resize_of(transformers.ViTImageProcessor(do_resize=False)) == {}
    assert Resize.of(resize_of(clip)) == Resize(shortest_edge=224, crop_height=224, crop_width=224)


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA", "LA", "P", "I;16", "CMYK", "1"])
@pytest.mark.parametrize("factors", [(3, 2), (7, 1), (1, 5), (4, 4)])
def test_reducing_a_tile_at_a_time_equals_reducing_the_whole(
    mode: str, factors: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(image_budget, "TILE_PIXELS", 997)  # many tiles, ragged edges
    image = _photo(203, 151, seed=len(mode)).convert(mode)
    whole = image.convert("RGB").reduce(factors)
    tiled = imaging._reduced_rgb(image, factors)
    assert tiled.mode == "RGB" and tiled.size == whole.size
    assert np.array_equal(np.asarray(tiled), np.asarray(whole))


def _levels(processor: Any, got: torch.Tensor, want: torch.Tensor) -> np.ndarray:
    """The difference of two processed images in levels of 255 (undoing the normalisation)."""
    std = torch.tensor(processor.image_std).reshape(1, -1, 1, 1)
    return ((got - want).abs() * std / processor.rescale_factor).numpy()


@pytest.mark.parametrize("form", ["PNG", "JPEG", "rotated JPEG"])
def test_a_large_image_reaches_the_processor_within_a_few_levels_of_its_full_size_self(
    form: str,
) -> None:
    photo = _photo(2400, 1600)
    if form == "rotated JPEG":
        exif = Image.Exif()
        exif[0x0112] = 6  # turned a quarter: upright it is 1600 x 2400
        data = _encoded(photo, "JPEG", quality=90, exif=exif)
    else:
        data = _encoded(photo, form.split()[-1], **({"quality": 90} if form == "JPEG" else {}))
    full = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    for processor in (
        transformers.ViTImageProcessor(),
        transformers.CLIPImageProcessor(
            size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}
        ),
    ):
        reduced = decode_image(data, resize=resize_of(processor))
        # Reduced before the processor, to no less than 3 times what it resizes to.
        assert max(reduced.size) < max(full.size) / 1.5
        if form == "rotated JPEG":
            assert reduced.size[0] < reduced.size[1]  # upright: taller than wide
        want = processor(images=full, return_tensors="pt")["pixel_values"]
        got = image_inputs(processor, [data], torch.device("cpu"))["pixel_values"]
        levels = _levels(processor, got, want)
        # Measured: at most 1 level of 255 apart, 0.12 to 0.21 on average.
        assert levels.max() <= 1.01 and levels.mean() <= 0.3, (levels.mean(), levels.max())


def _png_header(width: int, height: int, colour: int, depth: int = 8) -> bytes:
    """A real PNG of ``width`` x ``height`` cut after its header and the start of its
    pixels: it can never be decoded, so only a refusal read from the header answers it."""
    mode = {0: "L", 2: "RGB", 6: "RGBA"}[colour]
    return _encoded(Image.new(mode, (width, height)))[:120]


def test_an_image_over_the_budget_is_refused_from_its_header_naming_the_budget() -> None:
    strip = _png_header(25_000_000, 1, colour=2)  # RGB rows of 75 MB each, twice
    with pytest.raises(PayloadTooLarge, match=r"about 25\d MB.*--max-decode-bytes") as refused:
        check_image(strip, 25_000_000, "inputs[0]", max_bytes=DEFAULT_MAX_DECODE_BYTES)
    assert "inputs[0] is a 25000000x1 PNG image (RGB)" in str(refused.value)
    # The greyscale strip of the report fits the budget (it then fails as a cut file does).
    grey = _png_header(25_000_000, 1, colour=0)
    assert plan(Image.open(io.BytesIO(grey)), grey, None).peak == 25 * MB + 2 * (25 * MB + 1)


def test_a_strip_that_a_processor_would_stretch_is_refused_before_decoding() -> None:
    data = _encoded(Image.new("L", (10_000, 1), 128))
    clip = {"shortest_edge": 224, "crop_height": 224, "crop_width": 224}
    # CLIP's processor would resize it to 2,240,000 x 224 before cropping: gigabytes.
    with pytest.raises(PayloadTooLarge, match="--max-decode-bytes"):
        check_image(data, 25_000_000, max_bytes=DEFAULT_MAX_DECODE_BYTES, resize=clip)
    # A processor of a fixed size squeezes it to 224 x 224: served, a few MB.
    vit = {"height": 224, "width": 224}
    check_image(data, 25_000_000, max_bytes=DEFAULT_MAX_DECODE_BYTES, resize=vit)
    assert decode_image(data, resize=vit).size == (715, 1)  # 10000 // 14, >= 3 x 224


def test_each_decoder_is_counted_by_what_it_holds() -> None:
    square = _photo(640, 480)

    def decoding(data: bytes) -> int:
        return plan(Image.open(io.BytesIO(data)), data, None).decoding

    pixels = 640 * 480
    # A progressive JPEG holds every coefficient, 2 bytes per sample of each component.
    baseline = decoding(_encoded(square, "JPEG", subsampling=0))
    progressive = decoding(_encoded(square, "JPEG", subsampling=0, progressive=True))
    assert progressive - baseline == 3 * pixels * 2
    assert decoding(_encoded(square, "WEBP")) == 16 * pixels
    assert decoding(_encoded(square, "GIF")) == pixels
    assert decoding(_encoded(square, "TIFF")) == 2 * 4 * pixels
    assert decoding(_encoded(square.convert("I;16"))) == 2 * pixels + 2 * (640 * 2 + 1)
    # A JPEG for a model of 224 x 224 is decoded at a quarter of its size (1600 >= 3 x 224).
    big = _encoded(_photo(6400, 4800), "JPEG")
    planned = plan(Image.open(io.BytesIO(big)), big, Resize(height=224, width=224))
    assert planned.draft == (672, 672) and planned.decoding == 1600 * 1200 * 4


def test_decodes_running_at_once_hold_at_most_the_budget_first_come_first_served() -> None:
    gate = MemoryGate()
    entered = {name: threading.Event() for name in ("large", "small")}
    release = threading.Event()

    def decode(name: str, cost: int) -> None:
        with gate.reserve(cost, 100):
            entered[name].set()
            release.wait(10)

    threads = [
        threading.Thread(target=decode, args=("large", 50)),
        threading.Thread(target=decode, args=("small", 30)),
    ]
    with gate.reserve(60, 100):
        threads[0].start()
        assert gate.wait_for_waiting(1, 10)
        # 30 would fit beside the 60 held, but the large one asked first: it waits its turn.
        threads[1].start()
        assert gate.wait_for_waiting(2, 10)
        assert gate.reserved == 60 and not any(event.is_set() for event in entered.values())
    # Released: both fit the budget together (50 + 30), and both run.
    assert entered["large"].wait(10) and entered["small"].wait(10)
    assert gate.reserved == 80
    release.set()
    for thread in threads:
        thread.join(10)
    assert gate.reserved == 0
    # One reservation larger than the budget runs, alone.
    with gate.reserve(500, 100):
        assert gate.reserved == 500


def test_the_data_plane_check_holds_its_decoding_in_the_gate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held: list[int] = []
    load = imaging._load

    def watched(image: Image.Image, planned: Any, where: str) -> None:
        held.append(imaging.DECODES.reserved)
        load(image, planned, where)

    monkeypatch.setattr(imaging, "_load", watched)
    data = _encoded(Image.new("RGB", (300, 200)))
    check_image(data, 25_000_000, max_bytes=DEFAULT_MAX_DECODE_BYTES)
    assert held == [300 * 200 * 4 + 2 * (300 * 3 + 1)]
    assert imaging.DECODES.reserved == 0


def test_the_model_declares_its_rule_for_the_data_plane() -> None:
    metadata = {
        "inputs": [
            {"name": "text", "datatype": "BYTES"},
            {"name": "image", "content": "image", "resize": {"shortest_edge": 224}},
        ]
    }
    limits = model_limits(MediaLimits(max_decode_bytes=5 * MB), metadata)
    assert limits.image_resize == (("shortest_edge", 224),) and limits.max_decode_bytes == 5 * MB
    assert model_limits(MediaLimits(), {"inputs": [{"name": "image"}]}).image_resize is None


def test_the_budget_is_a_flag_a_variable_a_repository_key_and_a_load_override(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (model,) = parse_settings(["--max-decode-bytes", "5000000"], {}).models
    assert model.max_decode_bytes == 5_000_000 == model.media_limits.max_decode_bytes
    (model,) = parse_settings([], {"BATCHING_MAX_DECODE_BYTES": "7000000"}).models
    assert model.max_decode_bytes == 7_000_000
    assert parse_settings([], {}).models[0].max_decode_bytes == DEFAULT_MAX_DECODE_BYTES
    file = tmp_path / "models.toml"
    file.write_text(
        '[models.echo]\nsource = "tests.support.models:EchoModel"\nmax_decode_bytes = 9000000\n',
        encoding="utf-8",
    )
    (loaded,) = load_repository(file)
    assert loaded.max_decode_bytes == 9_000_000
    assert apply_overrides(loaded, {"max_decode_bytes": 3_000_000}).max_decode_bytes == 3_000_000
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--max-decode-bytes", "1000"], {})
    error = capsys.readouterr().err
    assert exited.value.code == 2 and "max_decode_bytes" in error
    with pytest.raises(ValueError, match="max_decode_bytes"):
        ModelConfig(name="m", max_decode_bytes=0)
