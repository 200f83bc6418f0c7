"""Tiny randomly initialised audio models written to a folder (Wav2Vec2 for CTC speech
recognition and for audio classification), and audio files to send them, for tests that run
offline in milliseconds."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import soundfile  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

RATE = 16_000
#: The CTC vocabulary: blank (the pad token), unknown, the word delimiter and a few letters.
VOCAB = ["<pad>", "<unk>", "|", *"abcdefghij"]
LABELS = ["yes", "no", "up", "down", "left", "right", "stop"]


def wav2vec2_config(norm: str = "layer", **extra: object) -> transformers.Wav2Vec2Config:
    # A wide initializer spreads the random outputs apart, so swapped answers differ.
    settings: dict[str, object] = {
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 24,
        "conv_dim": (16, 16, 16),
        "conv_stride": (5, 4, 4),
        "conv_kernel": (10, 8, 4),
        "num_conv_pos_embeddings": 8,
        "num_conv_pos_embedding_groups": 2,
        "feat_extract_norm": norm,
        "do_stable_layer_norm": norm == "layer",
        "vocab_size": len(VOCAB),
        "pad_token_id": 0,
        "initializer_range": 0.5,
    }
    return transformers.Wav2Vec2Config(**{**settings, **extra})


def _feature_extractor() -> transformers.Wav2Vec2FeatureExtractor:
    return transformers.Wav2Vec2FeatureExtractor(
        feature_size=1,
        sampling_rate=RATE,
        padding_value=0.0,
        do_normalize=True,
        return_attention_mask=True,
    )


def _extractor(folder: Path) -> None:
    _feature_extractor().save_pretrained(folder)


def ctc_folder(
    root: Path, name: str = "asr", norm: str = "layer", *, processor: bool = False
) -> Path:
    """A Wav2Vec2ForCTC folder with its feature extractor and a character tokenizer, each
    saved alone, or with ``processor`` as one ``Wav2Vec2Processor`` (whose
    ``processor_config.json`` holds the feature extractor: no ``preprocessor_config.json``)."""
    folder = root / name
    torch.manual_seed(3)
    config = wav2vec2_config(norm)
    transformers.Wav2Vec2ForCTC(config).save_pretrained(folder)
    vocab = root / f"{name}-vocab.json"
    vocab.write_text(json.dumps({token: index for index, token in enumerate(VOCAB)}))
    tokenizer = transformers.Wav2Vec2CTCTokenizer(
        str(vocab), unk_token="<unk>", pad_token="<pad>", word_delimiter_token="|"
    )
    if processor:
        transformers.Wav2Vec2Processor(
            feature_extractor=_feature_extractor(), tokenizer=tokenizer
        ).save_pretrained(folder)
        return folder
    _extractor(folder)
    tokenizer.save_pretrained(folder)
    return folder


def classifier_folder(root: Path, name: str = "kws") -> Path:
    """A Wav2Vec2ForSequenceClassification folder with its feature extractor."""
    folder = root / name
    torch.manual_seed(4)
    config = wav2vec2_config(
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: index for index, label in enumerate(LABELS)},
        classifier_proj_size=8,
    )
    transformers.Wav2Vec2ForSequenceClassification(config).save_pretrained(folder)
    _extractor(folder)
    return folder


def tone(seconds: float, frequency: float, rate: int = RATE, channels: int = 1) -> np.ndarray:
    """A tone with a little noise (seeded by the frequency), float32 in [-1, 1]."""
    rng = np.random.default_rng(int(frequency))
    times = np.arange(round(seconds * rate)) / rate
    mono = 0.4 * np.sin(2 * np.pi * frequency * times) + 0.1 * rng.standard_normal(len(times))
    if channels == 1:
        return mono.astype(np.float32)
    return np.stack([mono * (0.5 + index) / channels for index in range(channels)], axis=1).astype(
        np.float32
    )


def audio_file(samples: np.ndarray, rate: int = RATE, form: str = "WAV") -> bytes:
    """``samples`` as a WAV (16-bit PCM) or FLAC file."""
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=form, subtype="PCM_16")
    return out.getvalue()


def whisper_folder(root: Path, name: str = "whisper") -> Path:
    """A tiny English-only Whisper folder: model, feature extractor and a BPE tokenizer of a
    few letters and Whisper's special tokens; generation stops after 20 tokens."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    specials = [
        "<|endoftext|>",
        "<|startoftranscript|>",
        "<|en|>",
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nocaptions|>",
        "<|notimestamps|>",
    ]
    vocab = {token: index for index, token in enumerate(["!", *"abcdefgh", "Ġ", *specials])}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    end = "<|endoftext|>"
    tokenizer = transformers.WhisperTokenizer(
        str(folder / "vocab.json"),
        str(folder / "merges.txt"),
        unk_token=end,
        bos_token=end,
        eos_token=end,
        pad_token=end,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    config = transformers.WhisperConfig(
        vocab_size=len(vocab),
        num_mel_bins=80,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
        d_model=16,
        max_source_positions=1500,
        max_target_positions=64,
        pad_token_id=vocab[end],
        bos_token_id=vocab[end],
        eos_token_id=vocab[end],
        decoder_start_token_id=vocab["<|startoftranscript|>"],
        begin_suppress_tokens=None,
        suppress_tokens=[],
        init_std=0.5,
    )
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config)
    model.generation_config.max_length = 20
    model.generation_config.no_timestamps_token_id = vocab["<|notimestamps|>"]
    model.generation_config.is_multilingual = False
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    transformers.WhisperFeatureExtractor(feature_size=80).save_pretrained(folder)
    return folder
