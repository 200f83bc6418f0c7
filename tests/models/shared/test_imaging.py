"""Image bytes checked before they are queued: the size from the header alone (the
decompression-bomb guard included), undecodable bytes refused, base64 and data: URIs read
strictly, and the check run off the event loop."""

from __future__ import annotations

import contextlib
import io
import struct
import threading
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from PIL import Image

from batching.codecs.media import media_body, media_bytes
from batching.errors import InvalidRequest, PayloadTooLarge
from batching.model_config import ModelConfig
from batching.models import media
from batching.models.media import (
    DEFAULT_MAX_IMAGE_PIXELS,
    MAX_IMAGE_PIXELS_CAP,
    MediaLimits,
    check_media,
)
from batching.models.parameters import TaskItem
from batching.models.shared.imaging import PILLOW_MAX_PIXELS, check_image, decode_image, sample_png
from batching.plane.queueing import check_media_items
from batching.settings.cli import parse_settings
from batching.settings.repository import load_repository


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG signature, an IHDR chunk saying ``width`` x ``height``, and the start of an IDAT
    chunk: 70 bytes, and no pixels."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(header))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
        + struct.pack(">I", 1 << 20)
        + b"IDAT"
        + zlib.compress(b"\0" * 64)[:24]
    )


def test_the_size_comes_from_the_header_before_any_pixel() -> None:
    claimed = _png_claiming(5000, 4000)
    with pytest.raises(PayloadTooLarge, match="5000x4000"):
        check_image(claimed, 1_000_000)
    # Under the limit, the same header alone is a damaged image: decoding it fails.
    with pytest.raises(InvalidRequest, match="damaged or truncated"):
        check_image(claimed, 25_000_000)


def test_pillows_decompression_bomb_warning_is_a_413_not_a_log_line() -> None:
    bomb = _png_claiming(20000, 20000)  # 400 MP: over Pillow's own threshold
    with _no_warning(), pytest.raises(PayloadTooLarge):
        check_image(bomb, PILLOW_MAX_PIXELS)
    between = _png_claiming(10000, 9000)  # 90 MP: Pillow would only warn
    with _no_warning(), pytest.raises(PayloadTooLarge):
        check_image(between, PILLOW_MAX_PIXELS)


@contextlib.contextmanager
def _no_warning() -> Iterator[None]:
    """Fails when the block warns (Pillow's DecompressionBombWarning must not escape)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
    assert seen == [], [str(warning.message) for warning in seen]


def test_undecodable_bytes_are_a_400() -> None:
    for junk in (b"not an image", sample_png()[:40], b"GIF89a" + b"\0" * 20):
        with pytest.raises(InvalidRequest):
            check_image(junk, 25_000_000)


def test_decode_gives_rgb_upright() -> None:
    buffer = io.BytesIO()
    Image.new("L", (3, 2), 128).save(buffer, format="PNG")
    image = decode_image(buffer.getvalue())
    assert image.mode == "RGB" and image.size == (3, 2)


def test_base64_is_read_strictly_and_data_uris_of_the_kind_pass() -> None:
    assert media_bytes("aGVsbG8=", "image", "x") == b"hello"
    assert media_bytes("data:image/png;base64,aGVsbG8=", "image", "x") == b"hello"
    assert media_bytes("data:;base64,aGVsbG8=", "image", "x") == b"hello"
    assert media_bytes(b"raw", "image", "x") == b"raw"
    for bad in ("aGVsbG8", "http://127.0.0.1/a.png", "/etc/passwd", "data:image/png,abc", ""):
        with pytest.raises(InvalidRequest):
            media_bytes(bad, "image", "x")
    with pytest.raises(InvalidRequest, match="audio/wav"):
        media_bytes("data:audio/wav;base64,aGVsbG8=", "image", "x")


def test_a_raw_body_is_media_only_for_a_kind_the_model_declares() -> None:
    image = [{"name": "image", "content": "image"}]
    text = [{"name": "text"}]
    assert media_body(b"", "image/png", image) == ("image", "image")
    assert media_body(b"", "application/octet-stream", image) == ("image", "image")
    assert media_body(b"", "application/json", image) is None
    assert media_body(b"", "application/octet-stream", text) is None
    with pytest.raises(InvalidRequest):
        media_body(b"", "audio/wav", image)
    with pytest.raises(InvalidRequest):
        media_body(b"", "image/png", text)


@pytest.mark.anyio
async def test_the_data_plane_checks_images_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[bytes, str, int]] = []

    def record(data: bytes, limits: MediaLimits, where: str) -> None:
        seen.append((data, where, threading.get_ident()))

    monkeypatch.setitem(media.CHECKS, "image", record)
    deployment: Any = SimpleNamespace(
        metadata={
            "inputs": [
                {"name": "text", "datatype": "BYTES"},
                {"name": "image", "datatype": "BYTES", "content": "image"},
            ]
        },
        config=SimpleNamespace(media_limits=MediaLimits()),
    )
    items = [{"text": "a"}, TaskItem({"image": b"one"}), {"image": b"two"}]
    await check_media_items(deployment, items)
    assert [(data, where) for data, where, _ in seen] == [
        (b"one", "inputs[1].image"),
        (b"two", "inputs[2].image"),
    ]
    assert all(thread != threading.get_ident() for _, _, thread in seen)


def test_check_media_names_the_item() -> None:
    with pytest.raises(PayloadTooLarge, match=r"inputs\[1\]"):
        check_media(
            {"image": "image"},
            False,
            [sample_png(4, 4), sample_png(40, 40)],
            MediaLimits(max_image_pixels=100),
        )


def test_the_pixel_limit_is_a_flag_a_repository_key_and_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (model,) = parse_settings(["--max-image-pixels", "1234"], {}).models
    assert model.max_image_pixels == 1234 and model.media_limits.max_image_pixels == 1234
    assert parse_settings([], {}).models[0].max_image_pixels == DEFAULT_MAX_IMAGE_PIXELS
    file = tmp_path / "models.toml"
    file.write_text(
        '[models.echo]\nsource = "tests.support.models:EchoModel"\nmax_image_pixels = 99\n',
        encoding="utf-8",
    )
    assert load_repository(file)[0].max_image_pixels == 99
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--max-image-pixels", str(MAX_IMAGE_PIXELS_CAP + 1)], {})
    assert exited.value.code == 2 and "max_image_pixels" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_image_pixels"):
        ModelConfig(name="m", max_image_pixels=0)
