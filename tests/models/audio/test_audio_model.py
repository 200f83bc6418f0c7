"""Audio decoding (batching.models.shared.waveform) and the audio tasks
(batching.models.audio.audio_model) on tiny randomly initialised Wav2Vec2 models: answers equal
``transformers.pipeline`` given the same decoded samples, batches equal single answers, bad
audio is refused with the right error, and nothing is ever read from a path or fetched from a
URL."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import transformers

from batching.errors import InvalidRequest, PayloadTooLarge
from batching.models import ModelSource
from batching.models.audio.audio_model import AudioModel
from batching.models.parameters import TaskItem, check_parameters, declared_parameters
from batching.models.shared.waveform import check_header, decode, from_samples
from batching.models.source import ModelSourceError
from batching.settings.cli import parse_settings
from tests.support.audio import (
    LABELS,
    RATE,
    audio_file,
    classifier_folder,
    ctc_folder,
    tone,
    whisper_folder,
)

ASR = "automatic-speech-recognition"
CLASSIFY = "audio-classification"

#: Clips of different lengths, rates, channels and containers.
CLIPS = [
    (1.0, 300.0, RATE, 1, "WAV"),
    (0.45, 520.0, 44_100, 2, "FLAC"),
    (0.7, 700.0, 8_000, 1, "WAV"),
    (0.3, 950.0, 22_050, 1, "FLAC"),
]


def _clip(seconds: float, frequency: float, rate: int, channels: int, form: str) -> bytes:
    return audio_file(tone(seconds, frequency, rate, channels), rate, form)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("audio")
    return {
        ASR: ctc_folder(root),
        CLASSIFY: classifier_folder(root),
        "group": ctc_folder(root, "group-norm", norm="group"),
        "whisper": whisper_folder(root),
    }


@pytest.fixture(scope="module")
def models(folders: dict[str, Path]) -> Iterator[dict[str, AudioModel]]:
    loaded = {}
    for key, folder in folders.items():
        model = AudioModel(CLASSIFY if key == CLASSIFY else ASR, folder)
        model.load("cpu")
        loaded[key] = model
    yield loaded


@pytest.fixture(scope="module")
def pipelines(folders: dict[str, Path]) -> dict[str, Any]:
    return {
        key: transformers.pipeline(CLASSIFY if key == CLASSIFY else ASR, model=str(folder))
        for key, folder in folders.items()
    }


def _close(ours: Any, theirs: Any) -> None:
    """Equal answers: texts exactly, scores within 1e-4, labels in the same order."""
    if isinstance(theirs, dict):
        assert ours == theirs
        return
    assert [entry["label"] for entry in ours] == [entry["label"] for entry in theirs]
    np.testing.assert_allclose(
        [entry["score"] for entry in ours], [entry["score"] for entry in theirs], atol=1e-4
    )


# -- decoding ------------------------------------------------------------------------------


def test_decode_mixes_down_and_resamples_to_the_model_rate() -> None:
    times = np.arange(22_050) / 44_100
    sine = np.sin(2 * np.pi * 440.0 * times)
    stereo = np.stack([0.2 * sine, 0.6 * sine], axis=1).astype(np.float32)
    wave = decode(audio_file(stereo, 44_100, "FLAC"), RATE, 30.0)
    assert wave.rate == RATE and wave.samples.dtype == np.float32
    assert len(wave.samples) == RATE // 2
    # The mean of the channels (a 0.4 sine), still at 440 Hz at the new rate.
    assert abs(np.abs(wave.samples[1000:-1000]).max() - 0.4) < 0.01
    spectrum = np.abs(np.fft.rfft(wave.samples))
    assert abs(np.argmax(spectrum) * RATE / len(wave.samples) - 440.0) <= 2.0


def _as_file(data: bytes) -> Any:
    import io

    return io.BytesIO(data)


@pytest.mark.parametrize(
    "data",
    [b"", b"not audio at all", _clip(0.2, 300.0, RATE, 1, "WAV")[:40], b"RIFF\x00\x00\x00\x00WAVE"],
    ids=["empty", "text", "truncated-header", "bare-riff"],
)
def test_undecodable_audio_is_invalid(data: bytes) -> None:
    with pytest.raises(InvalidRequest, match="not a WAV or FLAC file"):
        decode(data, RATE, 30.0)


def test_other_containers_are_refused_by_name() -> None:
    import io

    out = io.BytesIO()
    soundfile.write(out, tone(0.2, 300.0), RATE, format="OGG")
    with pytest.raises(InvalidRequest, match="the audio is OGG; this server takes a WAV or FLAC"):
        decode(out.getvalue(), RATE, 30.0)


def _lying_flac(claimed_seconds: int) -> bytes:
    """A FLAC file cut after its first frames whose STREAMINFO claims ``claimed_seconds``:
    decoding it would find a fraction of a second, so only the header can call it long."""
    data = bytearray(_clip(1.0, 300.0, RATE, 1, "FLAC")[:2000])
    # STREAMINFO: 8 bytes in, 10 bytes of block and frame sizes, then 20 bits of rate,
    # 3 of channels, 5 of bits per sample and 36 of total samples.
    head = int.from_bytes(data[18:26], "big")
    total = claimed_seconds * RATE
    head = (head & ~((1 << 36) - 1)) | total
    data[18:26] = head.to_bytes(8, "big")
    return bytes(data)


def test_too_long_is_refused_from_the_header_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lying = _lying_flac(3600)
    assert soundfile.info(_as_file(lying)).frames == 3600 * RATE
    reads: list[Any] = []
    monkeypatch.setattr(soundfile.SoundFile, "read", lambda *a, **k: reads.append(a))
    with pytest.raises(PayloadTooLarge, match=r"lasts 3600.0 s; this server takes at most 30 s"):
        decode(lying, RATE, 30.0)
    with pytest.raises(PayloadTooLarge, match="at most 0.5 s"):
        decode(_clip(1.0, 300.0, RATE, 1, "WAV"), RATE, 0.5)
    assert reads == []  # no sample was decoded


def test_a_header_that_hides_its_length_is_bounded_while_decoding() -> None:
    # A WAV whose data chunk claims more than the file holds: libsndfile reads what is there.
    data = bytearray(_clip(2.0, 300.0, RATE, 1, "WAV"))
    data[40:44] = struct.pack("<I", 0xFFFFFFF0)
    with pytest.raises(PayloadTooLarge, match="at most 1 s"):
        decode(bytes(data), RATE, 1.0)
    assert len(decode(bytes(data), RATE, 30.0).samples) == 2 * RATE


def test_samples_take_their_stated_rate() -> None:
    row = tone(0.5, 440.0, 8_000)
    wave = from_samples(row, 8_000, RATE, 30.0)
    assert len(wave.samples) == RATE // 2
    same = from_samples(row.astype(np.float64), RATE, RATE, 30.0)
    assert same.samples.dtype == np.float32 and np.array_equal(same.samples, row)
    with pytest.raises(InvalidRequest, match="floats"):
        from_samples(np.arange(10, dtype=np.int32), RATE, RATE, 30.0)
    with pytest.raises(InvalidRequest, match="one row of floats"):
        from_samples(np.zeros((2, 10), np.float32), RATE, RATE, 30.0)
    with pytest.raises(InvalidRequest, match="finite"):
        from_samples(np.array([0.0, np.nan], np.float32), RATE, RATE, 30.0)
    with pytest.raises(InvalidRequest, match="no samples"):
        from_samples(np.zeros(0, np.float32), RATE, RATE, 30.0)
    with pytest.raises(InvalidRequest, match="sampling_rate"):
        from_samples(row, 50, RATE, 30.0)
    with pytest.raises(PayloadTooLarge, match="at most 0.1 s"):
        from_samples(row, 8_000, RATE, 0.1)


def test_check_header_reads_rate_and_channels() -> None:
    info = check_header(_clip(0.45, 520.0, 44_100, 2, "FLAC"), 30.0)
    assert (info.samplerate, info.channels, info.format) == (44_100, 2, "FLAC")


# -- the tasks -----------------------------------------------------------------------------


@pytest.mark.parametrize("task", [ASR, CLASSIFY, "group", "whisper"])
def test_answers_equal_the_pipeline_on_the_same_samples(
    task: str, models: dict[str, AudioModel], pipelines: dict[str, Any]
) -> None:
    files = [_clip(*clip) for clip in CLIPS]
    batched = models[task].predict(files)
    for data, ours in zip(files, batched, strict=True):
        samples = decode(data, RATE, 30.0).samples
        _close(ours, pipelines[task](samples))
        _close(models[task].predict([data])[0], ours)
    if task == CLASSIFY:
        assert {entry["label"] for entry in batched[0]} == set(LABELS)
    else:
        assert all(isinstance(answer["text"], str) for answer in batched)
    assert batched[0] != batched[1] or task == "whisper"  # different audio, different answers
    assert len({str(answer) for answer in batched}) > 1


def test_group_norm_models_batch_equal_lengths_only(models: dict[str, AudioModel]) -> None:
    model = models["group"]
    waves = [decode(_clip(*clip), RATE, 30.0) for clip in CLIPS + CLIPS[:1]]
    assert model._groups(waves) == [[0, 4], [1], [2], [3]]
    assert models[ASR]._groups(waves) == [[0, 1, 2, 3, 4]]


def test_parameters_apply_per_item(
    models: dict[str, AudioModel], pipelines: dict[str, Any]
) -> None:
    model, pipe = models[CLASSIFY], pipelines[CLASSIFY]
    data = _clip(*CLIPS[0])
    samples = decode(data, RATE, 30.0).samples
    declared = declared_parameters(model.metadata())
    top2 = TaskItem(data, check_parameters(declared, {"top_k": 2}))
    sigmoid = TaskItem(data, check_parameters(declared, {"function_to_apply": "sigmoid"}))
    answers = model.predict([top2, data, sigmoid])
    _close(answers[0], pipe(samples, top_k=2))
    _close(answers[1], pipe(samples))
    _close(answers[2], pipe(samples, function_to_apply="sigmoid"))
    assert len(answers[0]) == 2


def test_samples_with_their_rate_equal_the_same_audio_as_a_file(
    models: dict[str, AudioModel],
) -> None:
    model = models[ASR]
    declared = declared_parameters(model.metadata())
    row = tone(0.6, 410.0, 8_000)
    item = TaskItem(row, check_parameters(declared, {"sampling_rate": 8_000}))
    as_file = audio_file(row, 8_000)
    ours = model.predict([item, row[: RATE // 2]])
    expected = model.predict([from_samples(row, 8_000, RATE, 30.0).samples])
    assert ours[0] == expected[0]
    assert ours[1] == model.predict([row[: RATE // 2]])[0]  # no rate: the model's own
    assert model.predict([as_file])[0]["text"] is not None
    with pytest.raises(InvalidRequest, match="the file says 8000 Hz"):
        model.predict([TaskItem(as_file, check_parameters(declared, {"sampling_rate": RATE}))])


def test_a_string_is_base64_never_a_path_or_url(
    models: dict[str, AudioModel], tmp_path: Path
) -> None:
    model = models[ASR]
    data = _clip(*CLIPS[0])
    assert model.predict([base64.b64encode(data).decode()]) == model.predict([data])
    secret = tmp_path / "secret.wav"
    secret.write_bytes(data)
    for text in (str(secret), f"file://{secret}", "http://127.0.0.1:9/a.wav"):
        with pytest.raises(InvalidRequest, match="never read as a path or fetched as a URL"):
            model.predict([text])


def test_warmup_is_a_sine_as_samples_and_as_a_file(models: dict[str, AudioModel]) -> None:
    for model in models.values():
        batches = model.warmup_inputs(4)
        assert [len(batch) for batch in batches] == [1, 4]
        samples = batches[0][0]["samples"]
        assert samples.dtype == np.float32 and len(samples) == RATE
        assert check_header(batches[1][0], 30.0).format == "WAV"
        alone = model.predict(batches[0])
        outputs = model.predict(batches[1])
        assert len(outputs) == 4 and outputs[0] == outputs[3]
        _close(outputs[0], alone[0])  # the same second of sine, as a file or as samples
        # Server-wide defaults are tried on batch 1's item: a sampling_rate for samples fits.
        declared = declared_parameters(model.metadata())
        item = TaskItem(batches[0][0], check_parameters(declared, {"sampling_rate": 8_000}))
        assert len(model.predict([item])) == 1


def test_metadata_declares_audio_bytes_and_parameters(models: dict[str, AudioModel]) -> None:
    described = models[CLASSIFY].metadata()
    assert described["inputs"][0]["content"] == "audio"
    assert described["labels"] == LABELS
    assert sorted(described["parameters"]) == ["function_to_apply", "sampling_rate", "top_k"]
    assert sorted(models[ASR].metadata()["parameters"]) == ["sampling_rate"]


def test_source_builds_the_audio_model_for_audio_tasks(folders: dict[str, Path]) -> None:
    for task in (ASR, CLASSIFY):
        model = ModelSource.parse(str(folders[task]), task).build()
        assert isinstance(model, AudioModel) and model.task == task


def test_a_seq2seq_speech_model_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "s2t"
    config = transformers.Speech2TextConfig(
        vocab_size=20,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
        input_feat_per_channel=8,
        conv_channels=8,
    )
    transformers.Speech2TextForConditionalGeneration(config).save_pretrained(folder)
    ctc_folder(tmp_path, "parts")
    transformers.Speech2TextFeatureExtractor(feature_size=8, num_mel_bins=8).save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(tmp_path / "parts").save_pretrained(folder)
    capsys.readouterr()  # what building the folder printed
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--model", str(folder), "--task", ASR], {})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "holds Speech2TextForConditionalGeneration: --task automatic-speech-recognition" in err
    assert len(err.strip().splitlines()) == 1
    model = AudioModel(ASR, folder)  # built anyway, it refuses at load
    with pytest.raises(ValueError, match="CTC models"):
        model.load("cpu")


def test_a_folder_without_a_feature_extractor_is_refused_at_start(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "config.json").write_bytes((folders[CLASSIFY] / "config.json").read_bytes())
    with pytest.raises(ModelSourceError, match="has neither preprocessor_config.json nor "):
        ModelSource.parse(str(folder), CLASSIFY)


def test_max_audio_seconds_is_a_flag_and_a_repository_key(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", str(folders[ASR]), "--task", ASR]
    assert parse_settings(argv, {}).models[0].max_audio_seconds == 30.0
    settings = parse_settings([*argv, "--max-audio-seconds", "12.5"], {})
    assert settings.models[0].media_limits.max_audio_seconds == 12.5
    for bad in ("0", "-1", "4000"):
        with pytest.raises(SystemExit) as exited:
            parse_settings([*argv, "--max-audio-seconds", bad], {})
        assert exited.value.code == 2
        assert "max_audio_seconds" in capsys.readouterr().err
    repository = tmp_path / "models.toml"
    repository.write_text(
        f'[models.asr]\nsource = "{folders[ASR]}"\ntask = "{ASR}"\nmax_audio_seconds = 5\n'
    )
    loaded = parse_settings(["--model-repository", str(repository)], {})
    assert loaded.models[0].max_audio_seconds == 5.0


def test_whisper_hears_one_window_at_most(folders: dict[str, Path]) -> None:
    model = AudioModel(ASR, folders["whisper"], max_seconds=60.0)
    model.load("cpu")
    assert model.max_seconds == 30.0
    with pytest.raises(PayloadTooLarge, match="at most 30 s"):
        model.predict([audio_file(tone(31.0, 300.0, 8_000), 8_000)])
    assert ModelSource.parse(str(folders["whisper"]), ASR).kind == "pipeline"
