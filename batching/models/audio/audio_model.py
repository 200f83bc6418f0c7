"""The audio tasks: automatic-speech-recognition (CTC models, and Whisper through
``generate``) and audio-classification, served from a local model folder, batched through the
feature extractor and the model.

An input is the bytes of a WAV or FLAC file (a string is their base64, never a path or a
URL), or a row of float samples whose rate the request's ``sampling_rate`` parameter gives
(a KServe v2 FP32 tensor). :mod:`..shared.waveform` turns it into mono float32 at the feature
extractor's rate, on the instance's thread (never the event loop). The answers are the
``transformers.pipeline`` ones for the same samples: ``{"text": ...}`` per input for
speech recognition, ``[{"score", "label"}, ...]`` (the ``top_k`` best) for classification.

A batch is one forward pass where padding cannot change an answer: models whose feature
encoder normalises each frame (``feat_extract_norm: "layer"``) get the batch padded with an
attention mask, and their padded frames are cut off before decoding. Others (a group-norm
feature encoder normalises over the whole, padded, input) run the items of equal length
together, so every answer equals the one the item gets alone. Whisper's feature extractor pads
every item to its 30 s window, as the pipeline pads one, so any items share its batch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias, TypedDict

import numpy as np
import torch
import transformers

from batching.errors import InvalidRequest

from ..engines.engine_options import EngineOptions
from ..parameters import PARAMETERS_KEY, Param, TaskItem
from ..processors import FEATURE_EXTRACTOR, processor_settings
from ..shared.torch_models import WEIGHTS_LOADING, read_config, resolve_device
from ..shared.waveform import (
    Waveform,
    audio_bytes,
    check_header,
    decode,
    from_samples,
    sine,
    sine_wav,
)
from ..tasks.audio import (
    ASR,
    AUDIO_CLASSIFICATION,
    AUDIO_TASKS,
    AUTOMATIC_SPEECH_RECOGNITION,
    CLASSIFY,
    CONTENT,
    DEFAULT_MAX_SECONDS,
    MAX_RATE,
    MIN_RATE,
)

__all__ = ["AUDIO_INPUT", "SAMPLES_INPUT", "AudioModel"]

#: The ASR pipeline's name for Whisper models, served through ``generate``.
WHISPER = "seq2seq_whisper"

#: The metadata's inputs: a WAV or FLAC file, or mono float samples (a v2 FP32 tensor).
AUDIO_INPUT = "audio"
SAMPLES_INPUT = "samples"


class Transcript(TypedDict):
    """Speech recognition's answer to one input."""

    text: str


class Scored(TypedDict):
    """One of audio classification's best labels."""

    score: float
    label: str


#: One input's answer.
Answer: TypeAlias = Transcript | list[Scored]


class AudioModel:
    """One audio task over a local model folder (see the module's docstring).

    :param task: ``automatic-speech-recognition`` or ``audio-classification``.
    :param path: the folder: weights, ``config.json``, the feature extractor
        (``preprocessor_config.json``, or a processor's ``processor_config.json``) and, for
        speech recognition, the tokenizer.
    :param engine: accepted as every task's model is built; the audio tasks run on torch,
        fp32 (the settings refuse another engine or precision for them).
    :param max_seconds: the longest audio an input may hold (413 beyond).
    """

    def __init__(
        self,
        task: str,
        path: str | os.PathLike[str],
        engine: EngineOptions | None = None,
        max_seconds: float = DEFAULT_MAX_SECONDS,
    ) -> None:
        if task not in AUDIO_TASKS:
            raise ValueError(f"task {task!r} is not an audio task ({', '.join(AUDIO_TASKS)})")
        if not max_seconds > 0:
            raise ValueError("the longest audio must be a positive number of seconds")
        self.task = task
        self.path = Path(path)
        if not self.path.is_dir():
            raise ValueError(f"model folder {str(self.path)!r} does not exist")
        self.max_seconds = float(max_seconds)
        self._config = read_config(self.path / "config.json")
        extractor = processor_settings(self.path, FEATURE_EXTRACTOR) or {}
        #: The rate the feature extractor hears, known before loading (for the metadata).
        rate = extractor.get("sampling_rate")
        self.rate = int(rate) if isinstance(rate, int | float | str) and rate else 16_000
        # transformers' pipeline, whose methods are untyped.
        self._pipeline: Any = None
        self._device = torch.device("cpu")
        # Padding cannot change an answer only when the feature encoder normalises each frame.
        self._pads = self._config.get("feat_extract_norm") == "layer"
        self._whisper = False

    def load(self, device: str) -> None:
        self._device = resolve_device(device)
        with WEIGHTS_LOADING:
            # The task is one of AUDIO_TASKS, checked at construction; transformers' overloads
            # only accept each task name as a literal (the implementation takes str).
            pipe = transformers.pipeline(  # type: ignore[call-overload]
                self.task, model=str(self.path), device=self._device
            )
        kind = getattr(pipe, "type", None)
        if self.task == ASR and kind not in ("ctc", WHISPER):
            raise ValueError(
                f"{self.path}: speech recognition is served for CTC models (such as "
                "Wav2Vec2ForCTC, HubertForCTC) without a language-model decoder, and Whisper; "
                f"this folder's model is {type(pipe.model).__name__}"
            )
        pipe.model.eval()
        self.rate = int(pipe.feature_extractor.sampling_rate)
        self._whisper = kind == WHISPER
        if self._whisper:
            # Whisper hears one window (30 s): the pipeline's longer-form decoding is not served.
            window = pipe.feature_extractor.n_samples / self.rate
            self.max_seconds = min(self.max_seconds, float(window))
        self._pipeline = pipe

    def predict(self, inputs: Sequence[object]) -> list[Answer]:
        if self._pipeline is None:
            raise RuntimeError("AudioModel.predict called before load()")
        waves = [self._waveform(item) for item in inputs]
        outputs: dict[int, Answer] = {}
        for positions in self._groups(waves):
            answers = self._run([waves[index].samples for index in positions])
            for index, answer in zip(positions, answers, strict=True):
                outputs[index] = self._answer(answer, inputs[index])
        return [outputs[index] for index in range(len(inputs))]

    def _waveform(self, item: object) -> Waveform:
        """The item's audio, mono at the model's rate.

        :raises InvalidRequest: undecodable audio, a string that is not base64, or a
            ``sampling_rate`` that contradicts a file's header.
        :raises PayloadTooLarge: audio over the limit.
        """
        value, given = item, None
        if isinstance(item, TaskItem):
            value, given = item.input, item.get("sampling_rate")
        if given is not None and not isinstance(given, int):
            raise InvalidRequest(
                f"parameter 'sampling_rate' must be an integer from {MIN_RATE} to {MAX_RATE} Hz"
            )
        if isinstance(value, dict):
            # The doors' items: {"audio": file bytes} or {"samples": numbers}, exactly one.
            if len(value) != 1 or not set(value) <= {AUDIO_INPUT, SAMPLES_INPUT}:
                raise InvalidRequest(
                    f"an item is exactly one of {AUDIO_INPUT!r} (a WAV or FLAC file) or "
                    f"{SAMPLES_INPUT!r} (float samples)"
                )
            if SAMPLES_INPUT in value:
                value = np.asarray(value[SAMPLES_INPUT])
            else:
                value = value[AUDIO_INPUT]
        if isinstance(value, np.ndarray | list | tuple):
            return from_samples(
                value, self.rate if given is None else given, self.rate, self.max_seconds
            )
        data = audio_bytes(value)
        if given is not None:
            header = check_header(data, self.max_seconds)
            if header.samplerate != given:
                raise InvalidRequest(
                    f"parameter 'sampling_rate' is {given} Hz but the file says "
                    f"{header.samplerate} Hz; it applies to samples sent as numbers"
                )
        return decode(data, self.rate, self.max_seconds)

    def _groups(self, waves: Sequence[Waveform]) -> list[list[int]]:
        if self._pads or self._whisper:
            # Whisper's feature extractor pads every item to its 30 s window anyway.
            return [list(range(len(waves)))]
        by_length: dict[int, list[int]] = {}
        for index, wave in enumerate(waves):
            by_length.setdefault(len(wave.samples), []).append(index)
        return list(by_length.values())

    def _run(self, batch: list[np.ndarray]) -> list[torch.Tensor]:
        """One forward pass: per item, the CTC token ids of its own frames or Whisper's
        generated ids (speech recognition), or its logits (classification)."""
        pipe = self._pipeline
        if self._whisper:
            return self._generate(batch)
        extract: dict[str, object] = {"sampling_rate": self.rate, "return_tensors": "pt"}
        if self.task == ASR or (self._pads and len(batch) > 1):
            extract["return_attention_mask"] = True
        if len(batch) > 1:
            extract["padding"] = True
        features = pipe.feature_extractor(batch, **extract)
        model = pipe.model
        with torch.inference_mode():
            encoded = {
                model.main_input_name: features[model.main_input_name].to(self._device),
            }
            mask = features.get("attention_mask")
            if mask is not None:
                encoded["attention_mask"] = mask.to(self._device)
            logits = model(**encoded).logits.float().cpu()
        if self.task == CLASSIFY:
            return list(logits)
        lengths = [len(samples) for samples in batch]
        frames = model._get_feat_extract_output_lengths(torch.tensor(lengths)).tolist()
        return [row[:count].argmax(dim=-1) for row, count in zip(logits, frames, strict=True)]

    def _generate(self, batch: list[np.ndarray]) -> list[torch.Tensor]:
        """Whisper: the batch's features (each padded to the window, as the pipeline pads one
        item) through the pipeline's own forward step, ``generate`` with its defaults."""
        pipe = self._pipeline
        features = pipe.feature_extractor(
            batch, sampling_rate=self.rate, return_tensors="pt", return_attention_mask=True
        )
        inputs = {**features, "is_last": True}
        tokens = pipe.forward(inputs, **pipe._forward_params)["tokens"]
        return [tokens[index : index + 1] for index in range(len(batch))]

    def _answer(self, output: torch.Tensor, item: object) -> Answer:
        pipe = self._pipeline
        if self._whisper:
            # The pipeline's own decoding of one item's ids (special tokens and timestamps).
            text = pipe.postprocess(
                [{"tokens": output, "is_last": True}], **pipe._postprocess_params
            )
            return {"text": text["text"]}
        if self.task == ASR:
            # As the pipeline decodes CTC: repeats grouped, blanks (the pad token) dropped.
            return {"text": pipe.tokenizer.decode(output.numpy(), skip_special_tokens=False)}
        config = pipe.model.config
        function = item.get("function_to_apply") if isinstance(item, TaskItem) else None
        if function is None:
            function = {"regression": "none", "multi_label_classification": "sigmoid"}.get(
                config.problem_type, "softmax"
            )
        probs = output.softmax(-1) if function == "softmax" else output
        if function == "sigmoid":
            probs = output.sigmoid()
        top_k = item.get("top_k") if isinstance(item, TaskItem) else None
        scores, ids = probs.topk(min(top_k or config.num_labels, config.num_labels))
        return [
            {"score": score, "label": config.id2label[index]}
            for score, index in zip(scores.tolist(), ids.tolist(), strict=True)
        ]

    def warmup_inputs(self, max_batch_size: int) -> list[list[Mapping[str, np.ndarray] | bytes]]:
        """A second of a 440 Hz sine: as samples at batch 1 (the batch a server's default
        parameters, such as a ``sampling_rate`` for samples, are also tried on), and as a WAV
        file, decoded and heard, at the batch cap."""
        return [[{SAMPLES_INPUT: sine(self.rate)}], [sine_wav(self.rate)] * max_batch_size]

    def _parameters(self) -> tuple[Param, ...]:
        return AUDIO_CLASSIFICATION if self.task == CLASSIFY else AUTOMATIC_SPEECH_RECOGNITION

    def metadata(self) -> dict[str, object]:
        described: dict[str, object] = {
            # Each item is one of them: a file, or samples at the request's sampling_rate.
            "inputs": [
                {
                    "name": AUDIO_INPUT,
                    "datatype": "BYTES",
                    "shape": [-1],
                    "content": CONTENT,
                    "optional": True,
                    "exclusive": True,
                },
                {
                    "name": SAMPLES_INPUT,
                    "datatype": "FP32",
                    "shape": [-1, -1],
                    "optional": True,
                    "exclusive": True,
                },
            ],
            "outputs": [{"name": "output", "datatype": "BYTES", "shape": [-1]}],
            PARAMETERS_KEY: {param.name: param.describe() for param in self._parameters()},
            "sampling_rate": self.rate,
            "max_audio_seconds": self.max_seconds,
        }
        if self.task == CLASSIFY:
            id2label = self._config.get("id2label")
            by_index = id2label if isinstance(id2label, dict) else {}
            labels = [str(by_index[key]) for key in sorted(by_index, key=int)]
            if labels:
                described["labels"] = labels
        return described
