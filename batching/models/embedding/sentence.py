"""Sentence embeddings the way sentence-transformers computes them, with plain transformers:
prompts, every pooling mode, compact encodings, per-token vectors, tokenize and decode.

Tokenisation, pooling, normalisation and prompts run in numpy; torch and transformers are
imported only when torch computes the encoder (``--engine torch``, or the choice of ``auto``)
or where the folder's ``tokenizer.json`` does not tokenise as transformers does. The engines
are measured in a child process (:mod:`..engines.measuring_child`), so a server on OpenVINO or ONNX
Runtime never loads torch."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
from numpy.typing import NDArray

from ..default import DEFAULT_MODEL_NAME, default_model_path
from ..engines.engine_options import EngineOptions
from ..engines.job import EngineJob
from ..engines.measuring_child import run_apart
from ..engines.plan import EnginePlan
from ..engines.selection import measure_engines, select_engine
from ..items import (
    DecodeItem,
    EmbedItem,
    TokenizeItem,
    Tokens,
    TokenVectors,
)
from ..protocol import warmup_batches
from ..shared.text_models import (
    LazyCounter,
    TokenCounter,
    calibration_texts,
    read_config,
    warmup_text,
)
from . import tokenizing
from .prompts import PromptOptions, read_prompts
from .quantize import (
    CALIBRATION_COUNT,
    Calibration,
    calibration_sentences,
    kept_calibration,
    quantize,
    shorten,
)
from .sentence_modules import SentenceModules
from .sentence_outputs import as_array as _array
from .sentence_outputs import described
from .sentence_outputs import ids_of as _ids_of
from .tokenizer_json import FILE as TOKENIZER_JSON
from .tokenizer_json import JsonTokenizer, matches
from .tokenizing import Batch

if TYPE_CHECKING:  # annotations only: a server whose engine is not torch never loads them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from .tokenizing import TextTokenizer

__all__ = ["SentenceEmbedder"]

#: Words of the warm-up's short texts (its batch of the cap).
WARMUP_SHORT_WORDS = 16
#: The calibration texts are embedded this many at a time.
_CALIBRATION_BATCH = 32
#: Prompt lengths remembered (prompts come from the folder's list and the operator's default,
#: so a handful; the bound only keeps a stream of distinct prompts from growing the cache).
_PROMPT_CACHE = 256

#: What a measuring child process rebuilds the model from: ``SentenceEmbedder``'s arguments.
_Arguments: TypeAlias = tuple[
    "str | os.PathLike[str] | None", "int | None", "EngineOptions | None", "PromptOptions | None"
]
#: One item's output, for a batch holding option items.
_Output: TypeAlias = "NDArray[np.generic] | TokenVectors | Tokens | str"


class SentenceEmbedder:
    """Sentence embeddings from a sentence-transformers folder, computed with plain transformers.

    Reproduces sentence-transformers' ``encode`` for folders made of a Transformer, a Pooling
    and optionally a Normalize module: prepend the prompt, tokenise with truncation at
    ``max_seq_length``, run the encoder, pool (every mode ``1_Pooling/config.json`` may name:
    mean, cls, max, mean_sqrt_len_tokens, weightedmean, lasttoken; with the tokenizer's
    padding side, left for decoder embedders; prompt tokens left out when the folder says
    ``include_prompt: false``), then L2-normalise when ``modules.json`` lists Normalize
    (:mod:`batching.models.embedding.sentence_modules`, which says what other folders get).

    Prompts come from ``config_sentence_transformers.json``; the effective default (the
    folder's ``default_prompt_name``, unless ``prompt`` overrides it) is prepended to every
    plain ``str`` item, as ``encode`` prepends it. :class:`EmbedItem` items are applied as
    they say (their prompt, never the default; left truncation; per-token vectors;
    ``dimensions``; compact encodings with int8/uint8 ranges calibrated at load, see
    :mod:`batching.models.embedding.quantize`); :class:`TokenizeItem` and :class:`DecodeItem`
    items are answered by the tokenizer.

    ``predict(list[str])`` returns a float32 array of shape ``(n, dim)``; a batch holding
    other items returns one output per item (a 1-D array, :class:`TokenVectors`,
    :class:`Tokens` or ``str``).

    :param path: the model folder; ``None`` means the bundled all-MiniLM-L6-v2.
    :param max_seq_length: truncation length in tokens, overriding ``sentence_bert_config.json``.
    :param engine: what runs the encoder (:mod:`batching.models.engines`); tokenisation,
        pooling and normalisation stay the same whatever runs it. None: torch, fp32.
    :param prompt: the operator's default prompt (``--default-prompt-name`` or
        ``--default-prompt``), overriding the folder's.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        max_seq_length: int | None = None,
        engine: EngineOptions | None = None,
        prompt: PromptOptions | None = None,
    ) -> None:
        # What a measuring child process rebuilds this model from.
        self._arguments: _Arguments = (path, max_seq_length, engine, prompt)
        if path is None:
            self.path = default_model_path()
            self.name = DEFAULT_MODEL_NAME
        else:
            self.path = Path(path)
            self.name = self.path.resolve().name
        if not (self.path / "config.json").is_file():
            raise ValueError(f"{self.path} is not a model folder: it has no config.json")
        if max_seq_length is not None and max_seq_length < 1:
            raise ValueError(f"max_seq_length must be positive, not {max_seq_length}")

        self._config = read_config(self.path / "config.json")
        st_config_path = self.path / "sentence_bert_config.json"
        st_config = read_config(st_config_path) if st_config_path.is_file() else {}
        self._lowercase = bool(st_config.get("do_lower_case", False))
        # The length is resolved against the tokenizer and the position table on first use:
        # the folder's (or the operator's) max_seq_length when it is the smallest.
        declared = max_seq_length or st_config.get("max_seq_length")
        self._counting = LazyCounter(self.path, declared if isinstance(declared, int) else None)
        self.prompts = read_prompts(self.path, prompt, self.name)
        self._default_prompt = self.prompts.default

        self.modules = SentenceModules.read(self.path, self._config)
        self.pooling_modes = self.modules.modes
        # False: prompt tokens are left out of pooling (instruction models such as INSTRUCTOR).
        self.include_prompt = self.modules.include_prompt
        self.normalize = self.modules.normalize
        self.dimension: int = self.modules.dimension

        self.engine = engine or EngineOptions(engine="torch", precision="fp32")
        self._device = "cpu"
        self._model: EnginePlan | None = None
        self._tokenizer: TextTokenizer | None = None
        self._transformers_tokenizer: PreTrainedTokenizerBase | None = None
        self._quantization: Calibration | None = None
        self._prompt_lengths: dict[str, int] = {}

    @property
    def max_seq_length(self) -> int:
        return self._counting.resolved_max_length(self._counting_tokenizer)

    def _token_counter(self) -> TokenCounter:
        return self._counting.counter(self._counting_tokenizer)

    def _counting_tokenizer(self) -> JsonTokenizer | None:
        """The counter's own tokenizer object (it changes its backend's settings): the
        folder's tokenizer.json where this model tokenises with it, or (unloaded: the server's
        counting object) where its engine is not torch, which would load transformers; None:
        transformers'."""
        json_tokenizer = (
            isinstance(self._tokenizer, JsonTokenizer)
            if self._tokenizer is not None
            else self.engine.apart
            and self.engine.engine != "torch"
            and (self.path / TOKENIZER_JSON).is_file()
        )
        return JsonTokenizer(self.path) if json_tokenizer else None

    def load(self, device: str) -> None:
        device = device.strip()
        if device != "cpu":
            from ..shared.torch_models import (
                resolve_device,  # checks the spelling; CUDA needs torch
            )

            self._device = str(resolve_device(device))
        if self._counting.max_length is None:
            tokenizer = (
                JsonTokenizer(self.path)
                if (self.path / TOKENIZER_JSON).is_file()
                else self._reference_tokenizer()
            )
            self._counting.resolve(tokenizer, self._config)
        apart = self.engine.apart and self.engine.engine != "torch" and self._device == "cpu"
        self._model = select_engine(
            self._job(functools.partial(_measure_apart, self._arguments) if apart else None)
        )
        # The folder's tokenizer.json without transformers, where the measuring process found
        # that it tokenises exactly as transformers does.
        if (self.path / TOKENIZER_JSON).is_file() and self._model.notes.get(
            "tokenizer_json_differs", "not checked"
        ) is None:
            self._tokenizer = JsonTokenizer(self.path)
            self._transformers_tokenizer = None
        else:
            self._tokenizer = self._reference_tokenizer()
        self._quantization = Calibration(self._kept_calibration_vectors(), self.normalize)

    def _kept_calibration_vectors(self) -> np.ndarray:
        """:meth:`_calibration_vectors`, kept in the engine cache beside the decision they
        were computed with (a cached start then runs no calibration batch)."""
        assert self._model is not None
        key = [
            self._model.decision.to_json()["routes"],
            type(self._tokenizer).__name__,
            self.max_seq_length,
            self._default_prompt,
            self.include_prompt,
            CALIBRATION_COUNT,
        ]
        return kept_calibration(self._model.cache_folder, key, self._calibration_vectors)

    def _job(self, measure_apart: Callable[[bool], None] | None) -> EngineJob:
        return EngineJob(
            options=self.engine,
            folder=self.path,
            head="base",
            measure="embedding",
            device=self._device,
            input_names=self._input_names,
            load_reference=self._load_encoder,
            view=self._view,
            calibration=self._calibration,
            sample=self._sample,
            measure_apart=measure_apart,
            check_tokenizer=self._check_tokenizer,
        )

    def measure(self, force: bool) -> None:
        """Export, check and time the engine variants and keep the choice in the engine cache
        (what the measuring child process runs)."""
        measure_engines(self._job(None), force)

    def _reference_tokenizer(self) -> PreTrainedTokenizerBase:
        """transformers' tokenizer of the folder (it imports torch): the reference, and what
        tokenises when the folder's tokenizer.json cannot."""
        if self._transformers_tokenizer is None:
            import transformers

            self._transformers_tokenizer = transformers.AutoTokenizer.from_pretrained(
                str(self.path)
            )
        tokenizer: PreTrainedTokenizerBase = self._transformers_tokenizer
        return tokenizer

    def _input_names(self) -> tuple[str, ...]:
        return tuple(self._reference_tokenizer()(["a"], return_tensors="np").keys())

    def _check_tokenizer(self) -> str | None:
        if not (self.path / TOKENIZER_JSON).is_file():
            return f"no {TOKENIZER_JSON}"
        return matches(self.path, self._reference_tokenizer(), self.max_seq_length)

    def _calibration_vectors(self) -> np.ndarray:
        """The chosen engine's vectors of the calibration texts (for the int8/uint8 ranges),
        run shortest first so that each batch pads little."""
        texts = calibration_sentences()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        ran = np.concatenate(
            [
                self.predict([texts[i] for i in order[start : start + _CALIBRATION_BATCH]])
                for start in range(0, len(order), _CALIBRATION_BATCH)
            ]
        )
        vectors = np.empty_like(ran)
        vectors[order] = ran
        return vectors

    def _load_encoder(self) -> PreTrainedModel:
        import transformers

        from ..shared.torch_models import load_eval

        return load_eval(transformers.AutoModel, self.path, self._device)

    def _encode(self, texts: list[str]) -> Batch:
        texts = [text.lower() for text in texts] if self._lowercase else texts
        tokenizer = self._tokenizer if self._tokenizer is not None else self._reference_tokenizer()
        return tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_seq_length,
            return_tensors="np",
        )

    def _calibration(self) -> list[Batch]:
        texts = calibration_texts(self.max_seq_length, self._default_prompt)
        return [self._encode(texts), self._encode(texts[-1:])]

    def _sample(self, size: int) -> Batch:
        return self._encode([warmup_text(self.max_seq_length)] * size)

    def _view(self, hidden: object, encoded: Batch) -> np.ndarray:
        return self.modules.vectors(_array(hidden), np.asarray(encoded["attention_mask"]), None)

    def unload(self) -> None:
        """Stop the engine plan's background threads (idle release, retake)."""
        if self._model is not None:
            self._model.close()

    def predict(self, inputs: Sequence[object]) -> np.ndarray | list[_Output]:
        if self._model is None:
            raise RuntimeError("SentenceEmbedder.predict called before load()")
        plain = [item for item in inputs if isinstance(item, str)]
        if len(plain) != len(inputs):
            return self._predict_items(inputs)
        if not inputs:
            return np.zeros((0, max(self.dimension, 0)), dtype=np.float32)
        prompt = self._default_prompt
        texts = [prompt + text for text in plain] if prompt else plain
        encoded = self._encode(texts)
        hidden = _array(self._model(encoded))
        lengths = None
        if prompt and not self.include_prompt:
            lengths = self._prompt_lengths_of([prompt] * len(texts))
        return self.modules.vectors(hidden, np.asarray(encoded["attention_mask"]), lengths)

    def _predict_items(self, inputs: Sequence[object]) -> list[_Output]:
        """One output per item, for a batch holding option items (or anything but a str)."""
        outputs: list[_Output] = [""] * len(inputs)
        rows: list[tuple[int, EmbedItem]] = []
        for index, item in enumerate(inputs):
            if isinstance(item, str):
                rows.append((index, EmbedItem(item, prompt=self._default_prompt)))
            elif isinstance(item, EmbedItem):
                self.modules.check(item, self.name)
                rows.append((index, item))
            elif isinstance(item, TokenizeItem):
                outputs[index] = tokenizing.tokenize(self._loaded(), item, self._lowercase)
            elif isinstance(item, DecodeItem):
                outputs[index] = tokenizing.decode(self._loaded(), item)
            else:
                raise TypeError(
                    f"input {index} is {type(item).__name__}, expected a string or an item"
                )
        if rows:
            for (index, _), output in zip(
                rows, self._embed([item for _, item in rows]), strict=True
            ):
                outputs[index] = output
        return outputs

    def _loaded(self) -> TextTokenizer:
        tokenizer = self._tokenizer
        if tokenizer is None:
            raise RuntimeError("SentenceEmbedder.predict called before load()")
        return tokenizer

    def _embed(self, items: list[EmbedItem]) -> list[_Output]:
        assert self._model is not None
        texts = [item.prompt + item.text for item in items]
        texts = [text.lower() for text in texts] if self._lowercase else texts
        prompts = [item.prompt for item in items]
        needs_lengths = not self.include_prompt or any(item.truncate_left for item in items)
        lengths = self._prompt_lengths_of(prompts) if needs_lengths else None
        left = [item.truncate_left for item in items]
        encoded = tokenizing.encode_batch(self._loaded(), texts, left, lengths, self.max_seq_length)
        hidden = _array(self._model(encoded))
        mask = np.asarray(encoded["attention_mask"])
        pooled = self.modules.vectors(hidden, mask, lengths)
        outputs: list[_Output] = []
        for row, item in enumerate(items):
            if item.output == "tokens":
                real = mask[row].astype(bool)
                ids = np.asarray(encoded["input_ids"][row])[real].astype(np.int64)
                vectors = np.array(hidden[row][real], dtype=np.float32)
                outputs.append(TokenVectors(ids=ids, vectors=vectors))
            else:
                outputs.append(self._dense(pooled[row], item))
        return outputs

    def _dense(self, vector: np.ndarray, item: EmbedItem) -> np.ndarray:
        vector = shorten(vector, item.dimensions, self.normalize)
        if item.encoding in ("int8", "uint8"):
            return quantize(vector, item.encoding, self.quantization_ranges(item.dimensions))
        return quantize(vector, item.encoding)

    def quantization_ranges(self, dimensions: int | None = None) -> np.ndarray | None:
        """The int8/uint8 ranges ``[2, width]`` for vectors of ``dimensions`` (all when None),
        calibrated at load; None before."""
        quantization = self._quantization
        return None if quantization is None else quantization.ranges(dimensions)

    def _prompt_lengths_of(self, prompts: list[str]) -> np.ndarray:
        """Per row, the tokens its prompt takes (sentence-transformers' prompt length)."""
        known = self._prompt_lengths
        if len(known) > _PROMPT_CACHE:
            known.clear()
        for prompt in set(prompts) - known.keys():
            text = prompt.lower() if self._lowercase else prompt
            known[prompt] = tokenizing.prompt_length(self._loaded(), text)
        return np.array([known[prompt] for prompt in prompts], dtype=np.int64)

    def _text(self, item: object) -> str | None:
        """What ``item`` tokenises to (prompt included), lower-cased as the model reads it."""
        if isinstance(item, str):
            text = self._default_prompt + item if self._default_prompt else item
        elif isinstance(item, EmbedItem | TokenizeItem):
            text = item.prompt + item.text
        else:
            return None
        return text.lower() if self._lowercase else text

    def count_tokens(self, item: object) -> int:
        """Tokens ``item`` costs in a batch (its prompt and special tokens included), capped at
        the max length; a :class:`DecodeItem` costs its ids."""
        text = self._text(item)
        if text is None:
            return max(1, min(len(_ids_of(item)), self.max_seq_length))
        return self._token_counter().count(text)

    def token_length(self, item: object, limit: int) -> int:
        """Tokens ``item`` has before truncation (prompt and special tokens included), counted
        no further than ``limit``."""
        text = self._text(item)
        if text is None:
            return min(len(_ids_of(item)), limit)
        return self._token_counter().length(text, limit)

    def warmup_inputs(self, max_batch_size: int) -> list[list[str]]:
        """One text of the full length alone, then the batch cap of short texts (the lengths
        most requests have): each dimension at its largest once, without a batch of the cap
        at the full length, which took over half of a cached start (the engine's choice
        measured that size already)."""
        if max_batch_size <= 1:
            return warmup_batches(warmup_text(self.max_seq_length), max_batch_size)
        short = warmup_text(min(WARMUP_SHORT_WORDS, self.max_seq_length))
        return [[warmup_text(self.max_seq_length)], [short] * max_batch_size]

    def metadata(self) -> dict[str, object]:
        quantization = self._quantization
        return described(
            dimension=self.dimension,
            normalize=self.normalize,
            prompts=self.prompts,
            max_seq_length=self.max_seq_length,
            ranges=None if quantization is None else quantization.describe(),
            vocab_size=None if self._tokenizer is None else len(self._tokenizer),
            token_dimension=self._config.get("hidden_size") or self._config.get("d_model"),
            engine=self._model.describe() if self._model is not None else None,
        )


def _measure(arguments: _Arguments, force: bool) -> None:
    SentenceEmbedder(*arguments).measure(force)


def _measure_apart(arguments: _Arguments, force: bool) -> None:
    """Measure the engines of the model built from ``arguments`` in a child process."""
    run_apart(functools.partial(_measure, arguments, force))
