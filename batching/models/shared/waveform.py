"""Audio as the audio tasks take it: WAV or FLAC file bytes, or samples at a stated rate,
turned into one mono float32 waveform at the model's sampling rate.

The bytes are decoded in-process by libsndfile (``soundfile``, whose wheels bundle it: no
ffmpeg). A string is only ever base64 of the file's bytes: nothing here opens a path or
fetches a URL. The length limit is checked on the header, before anything is decoded, and
again while decoding (a header may lie), so an over-long audio costs a header read:

- not WAV or FLAC, not audio at all, or damaged: :class:`InvalidRequest` (400);
- longer than ``max_seconds``: :class:`PayloadTooLarge` (413), naming the limit.

Channels are mixed down by their mean (as ``librosa.to_mono`` and ffmpeg's ``-ac 1`` do)
and the result is resampled with soxr at its "HQ" quality (librosa's default resampler): a
band-limited resampler in C for any pair of rates, whose cost does not grow with the ratio's
terms (scipy's ``resample_poly`` builds a filter as long as the reduced ratio's terms, which
for rates such as 44 099 Hz -> 16 kHz is millions of taps).

Memory follows what the model hears, not what the file holds: the file is decoded a block of
at most :data:`BLOCK_BYTES` at a time (every channel of a few frames), each block mixed down
and fed to soxr's streaming resampler (whose output equals its one-call ``resample``), so
besides the file's bytes only one block and the mono waveform at the model's rate are held:
a 30 s, 8-channel, 384 kHz FLAC costs a few MB, not its 92 million decoded samples. The data
plane's check keeps nothing but one block.

Pure numpy, soundfile and soxr: no torch.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import soundfile
import soxr
from numpy.typing import ArrayLike

from batching.errors import InvalidRequest, PayloadTooLarge

from ..tasks.audio import MAX_RATE, MIN_RATE

__all__ = [
    "BLOCK_BYTES",
    "FORMATS",
    "Waveform",
    "audio_bytes",
    "check_audio",
    "check_header",
    "decode",
    "from_samples",
    "sine",
    "sine_wav",
]

#: The containers taken, as libsndfile names them.
FORMATS = ("WAV", "WAVEX", "RF64", "FLAC")
#: Bytes decoded at a time (every channel of as many frames as fit, as float32).
BLOCK_BYTES = 1 << 20
_TAKES = "a WAV or FLAC file"


@dataclass(frozen=True, slots=True)
class Waveform:
    """Mono float32 samples at ``rate`` Hz."""

    samples: np.ndarray
    rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate


def audio_bytes(value: object) -> bytes:
    """The file bytes of an input: ``bytes`` as they are, a string as base64 (never a path or
    a URL).

    :raises InvalidRequest: a string that is not base64, or any other type.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise InvalidRequest(
                f"a string input is the base64 of {_TAKES}; it is never read as a path or "
                "fetched as a URL"
            ) from None
    raise InvalidRequest(
        f"an audio input is {_TAKES} (bytes or base64), not {type(value).__name__}"
    )


def check_header(data: bytes, max_seconds: float) -> soundfile._SoundFileInfo:
    """The header of ``data``, read without decoding the samples.

    :raises InvalidRequest: not WAV or FLAC, or no header libsndfile can read.
    :raises PayloadTooLarge: the header says it lasts longer than ``max_seconds``.
    """
    try:
        info = soundfile.info(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError):
        raise InvalidRequest(f"the audio is not {_TAKES} that can be decoded") from None
    if info.format not in FORMATS:
        raise InvalidRequest(f"the audio is {info.format}; this server takes {_TAKES}")
    _check_rate(info.samplerate, "the audio's sampling rate")
    if info.channels < 1:
        raise InvalidRequest(f"the audio is not {_TAKES} that can be decoded")
    # FLAC may leave the length unknown (0, or libsndfile's maximum): decode() bounds it.
    if 0 < info.frames < 1 << 62:
        _check_seconds(info.frames / info.samplerate, max_seconds)
    return info


def decode(data: bytes, rate: int, max_seconds: float) -> Waveform:
    """``data`` (WAV or FLAC bytes) as mono float32 at ``rate`` Hz, decoded a block at a time.

    :raises InvalidRequest: not WAV or FLAC, damaged, or no samples.
    :raises PayloadTooLarge: longer than ``max_seconds`` (by its header, or once decoded).
    """
    info = check_header(data, max_seconds)
    mono = (block.mean(axis=1, dtype=np.float32) for block in _blocks(data, info, max_seconds))
    return _at_rate(mono, int(info.samplerate), rate)


def check_audio(data: bytes, max_seconds: float, where: str = "the audio") -> None:
    """Refuse what :func:`decode` would refuse, by decoding it (a block at a time, nothing
    kept, no resampling): what the data plane runs before it queues an item, so that bad
    audio never reaches a batch.

    :raises InvalidRequest: as :func:`decode`, the message naming ``where``.
    :raises PayloadTooLarge: as :func:`decode`, the message naming ``where``.
    """
    try:
        for _ in _blocks(data, check_header(data, max_seconds), max_seconds):
            pass
    except PayloadTooLarge as exc:
        raise PayloadTooLarge(f"{where}: {exc}") from None
    except InvalidRequest as exc:
        raise InvalidRequest(f"{where}: {exc}") from None


def _blocks(
    data: bytes, info: soundfile._SoundFileInfo, max_seconds: float
) -> Iterator[np.ndarray]:
    """The frames of ``data`` (every channel, float32), :data:`BLOCK_BYTES` at most at a
    time, read no further than the limit."""
    limit = math.floor(max_seconds * info.samplerate)
    frames_per_block = max(1, BLOCK_BYTES // (4 * info.channels))
    frames = 0
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as file:
            while True:
                block = file.read(
                    min(frames_per_block, limit + 1 - frames), dtype="float32", always_2d=True
                )
                if not len(block):
                    break
                frames += len(block)
                if frames > limit:
                    _check_seconds(frames / info.samplerate, max_seconds)
                yield block
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError):
        raise InvalidRequest(f"the audio is not {_TAKES} that can be decoded") from None
    if not frames:
        raise InvalidRequest("the audio holds no samples")


def from_samples(values: ArrayLike, given_rate: int, rate: int, max_seconds: float) -> Waveform:
    """Samples sent as numbers (a KServe v2 FP32 tensor's row) at ``given_rate`` Hz, as mono
    float32 at ``rate`` Hz.

    :raises InvalidRequest: not a 1-D row of finite floats, empty, or a rate out of range.
    :raises PayloadTooLarge: longer than ``max_seconds``.
    """
    _check_rate(given_rate, "parameter 'sampling_rate'")
    array = np.asarray(values)
    if array.dtype.kind != "f":
        raise InvalidRequest(
            f"audio samples are floats (FP32, in [-1, 1]), not {array.dtype.name or 'that'}"
        )
    if array.ndim != 1:
        raise InvalidRequest(
            "audio samples are one row of floats per item (mono): send shape [n, samples] "
            f"or [samples], got an item of shape {list(array.shape)}"
        )
    if not array.size:
        raise InvalidRequest("the audio holds no samples")
    _check_seconds(array.size / given_rate, max_seconds)
    samples = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(samples).all():
        raise InvalidRequest("audio samples must be finite numbers")
    return _at_rate([samples], given_rate, rate)


def sine(rate: int, seconds: float = 1.0, frequency: float = 440.0) -> np.ndarray:
    """A sine at half scale, float32 samples at ``rate`` Hz: what a warm-up hears."""
    times = np.arange(round(rate * seconds), dtype=np.float64) / rate
    return (0.5 * np.sin(2 * np.pi * frequency * times)).astype(np.float32)


def sine_wav(rate: int, seconds: float = 1.0, frequency: float = 440.0) -> bytes:
    """:func:`sine` as a 16-bit WAV file: what a warm-up decodes and hears."""
    out = io.BytesIO()
    soundfile.write(out, sine(rate, seconds, frequency), rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def _at_rate(chunks: Iterable[np.ndarray], given: int, rate: int) -> Waveform:
    """Mono ``chunks`` at ``given`` Hz as one waveform at ``rate`` Hz, resampled as they come
    (soxr's stream gives what its one-call ``resample`` of the whole would)."""
    if given == rate:
        parts = list(chunks)
    else:
        stream = soxr.ResampleStream(given, rate, 1, dtype="float32", quality="HQ")
        parts = [stream.resample_chunk(chunk) for chunk in chunks]
        parts.append(stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
    return Waveform(np.ascontiguousarray(np.concatenate(parts), dtype=np.float32), rate)


def _check_rate(rate: object, what: str) -> None:
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
        raise InvalidRequest(f"{what} must be an integer from {MIN_RATE} to {MAX_RATE} Hz")


def _check_seconds(seconds: float, max_seconds: float) -> None:
    if seconds > max_seconds:
        raise PayloadTooLarge(
            f"the audio lasts {seconds:.1f} s; this server takes at most {max_seconds:g} s "
            "(--max-audio-seconds)"
        )
