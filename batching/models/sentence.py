"""Sentence embeddings the way sentence-transformers computes them, with plain transformers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from ._torch import (
    WEIGHTS_LOADING,
    TokenCounter,
    calibration_texts,
    encode,
    encode_and_run,
    max_length_of,
    mean_pool,
    read_json,
    require_strings,
    resolve_device,
    to_numpy,
    warmup_text,
)
from .default import DEFAULT_MODEL_NAME, default_model_path
from .engines.options import EngineOptions
from .engines.plan import EnginePlan
from .engines.selection import EngineJob, select_engine
from .protocol import warmup_batches

__all__ = ["SentenceEmbedder"]

# Pooling modes in the order sentence-transformers concatenates the legacy boolean flags.
_LEGACY_POOLING_FLAGS: dict[str, str] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_SUPPORTED_POOLING = ("cls", "max", "mean", "mean_sqrt_len_tokens")


class SentenceEmbedder:
    """Sentence embeddings from a sentence-transformers folder, computed with plain transformers.

    Reproduces sentence-transformers' ``encode`` for folders made of a Transformer, a Pooling
    and optionally a Normalize module: tokenise with truncation at ``max_seq_length``, run the
    encoder, pool (mean, cls, max or mean_sqrt_len_tokens, as ``1_Pooling/config.json`` says),
    then L2-normalise when ``modules.json`` lists Normalize. A folder without ``modules.json``
    is pooled with its pooling config (mean if none) and normalised, since unit vectors are
    what cosine search expects. Folders with other modules (Dense, ...) are refused rather than
    served with silently different vectors.

    ``predict(list[str])`` returns a float32 array of shape ``(n, dim)``.

    :param path: the model folder; ``None`` means the bundled all-MiniLM-L6-v2.
    :param max_seq_length: truncation length in tokens, overriding ``sentence_bert_config.json``.
    :param engine: what runs the encoder (:mod:`batching.models.engines`); tokenisation,
        pooling and normalisation stay the same whatever runs it. None: torch, fp32.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        max_seq_length: int | None = None,
        engine: EngineOptions | None = None,
    ) -> None:
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

        self._config: dict[str, Any] = read_json(self.path / "config.json")
        st_config_path = self.path / "sentence_bert_config.json"
        st_config = read_json(st_config_path) if st_config_path.is_file() else {}
        self._lowercase = bool(st_config.get("do_lower_case", False))
        # None until known: resolved against the tokenizer on first use, as
        # sentence-transformers does when its config names no length.
        self._max_seq_length: int | None = max_seq_length or st_config.get("max_seq_length")

        pooling_dir, self.normalize = self._read_modules()
        pooling_path = self.path / pooling_dir / "config.json"
        pooling = read_json(pooling_path) if pooling_path.is_file() else {}
        self.pooling_modes = self._pooling_modes(pooling)
        width = pooling.get("word_embedding_dimension") or pooling.get("embedding_dimension")
        if not isinstance(width, int):
            width = self._config.get("hidden_size") or self._config.get("d_model")
        self.dimension: int = width * len(self.pooling_modes) if isinstance(width, int) else -1

        self.engine = engine or EngineOptions(engine="torch", precision="fp32")
        self._device = torch.device("cpu")
        self._model: EnginePlan | None = None
        self._tokenizer: Any = None
        self._counter: TokenCounter | None = None

    def _read_modules(self) -> tuple[str, bool]:
        """Where the pooling config lives, and whether outputs are normalised."""
        modules_path = self.path / "modules.json"
        if not modules_path.is_file():
            return "1_Pooling", True
        pooling_dir, normalize = "1_Pooling", False
        for module in read_json(modules_path):
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind == "Pooling":
                pooling_dir = module.get("path") or pooling_dir
            elif kind == "Normalize":
                normalize = True
            elif kind != "Transformer":
                raise ValueError(
                    f"{self.path}: module {kind!r} in modules.json is not supported; "
                    "only Transformer, Pooling and Normalize are"
                )
        return pooling_dir, normalize

    def _pooling_modes(self, pooling: dict[str, Any]) -> tuple[str, ...]:
        mode = pooling.get("pooling_mode")
        if isinstance(mode, str):
            modes: tuple[str, ...] = (mode,)
        elif isinstance(mode, list | tuple):
            modes = tuple(mode)
        else:
            modes = tuple(m for key, m in _LEGACY_POOLING_FLAGS.items() if pooling.get(key))
        modes = modes or ("mean",)
        unsupported = [m for m in modes if m not in _SUPPORTED_POOLING]
        if unsupported:
            raise ValueError(
                f"{self.path}: pooling {unsupported} is not supported; "
                f"supported: {', '.join(_SUPPORTED_POOLING)}"
            )
        return modes

    @property
    def max_seq_length(self) -> int:
        if self._max_seq_length is None:
            self._max_seq_length = self._token_counter().max_length
        return self._max_seq_length

    def _token_counter(self) -> TokenCounter:
        # Built lazily and without a lock: a race builds two equal counters and one wins, and
        # keeping locks out of the object keeps it picklable for process-based instances.
        counter = self._counter
        if counter is None:
            counter = self._counter = TokenCounter(self.path, self._max_seq_length)
        return counter

    def load(self, device: str) -> None:
        self._device = resolve_device(device)
        self._tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.path))
        if self._max_seq_length is None:
            self._max_seq_length = max_length_of(self._tokenizer, self._config)
        self._model = select_engine(
            EngineJob(
                options=self.engine,
                folder=self.path,
                head="base",
                measure="embedding",
                device=str(self._device),
                input_names=tuple(self._tokenizer(["a"], return_tensors="pt").keys()),
                load_reference=self._load_encoder,
                view=self._view,
                calibration=self._calibration,
                sample=self._sample,
            )
        )

    def _load_encoder(self) -> Any:
        with WEIGHTS_LOADING:
            model = transformers.AutoModel.from_pretrained(str(self.path))
        model.eval()
        return model.to(self._device)

    def _encode(self, texts: list[str]) -> Any:
        texts = [text.lower() for text in texts] if self._lowercase else texts
        return encode(self._tokenizer, texts, self.max_seq_length, self._device)

    def _calibration(self) -> list[Any]:
        texts = calibration_texts(self.max_seq_length)
        return [self._encode(texts), self._encode(texts[-1:])]

    def _sample(self, size: int) -> Any:
        return self._encode([warmup_text(self.max_seq_length)] * size)

    def _view(self, hidden: torch.Tensor, encoded: Any) -> np.ndarray:
        with torch.inference_mode():
            return to_numpy(self._vectors(hidden, encoded["attention_mask"]))

    def predict(self, inputs: list[str]) -> np.ndarray:
        if self._model is None:
            raise RuntimeError("SentenceEmbedder.predict called before load()")
        require_strings(inputs)
        if not inputs:
            return np.zeros((0, max(self.dimension, 0)), dtype=np.float32)
        texts = [text.lower() for text in inputs] if self._lowercase else inputs
        with torch.inference_mode():
            hidden, mask = encode_and_run(
                self._tokenizer, self._model, texts, self.max_seq_length, self._device
            )
            pooled = self._vectors(hidden, mask)
        return to_numpy(pooled)

    def _vectors(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pooled = self._pool(hidden, mask)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
        return pooled

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        vectors: list[torch.Tensor] = []
        for mode in self.pooling_modes:
            if mode == "mean":
                vectors.append(mean_pool(hidden, mask))
            elif mode == "mean_sqrt_len_tokens":
                vectors.append(mean_pool(hidden, mask, sqrt_len=True))
            elif mode == "cls":
                # The first real token: index 0 with right padding, later with left padding.
                first = mask.to(torch.int32).argmax(dim=1)
                vectors.append(hidden[torch.arange(hidden.shape[0], device=hidden.device), first])
            else:  # max
                padding = (mask == 0).unsqueeze(-1)
                vectors.append(hidden.masked_fill(padding, float("-inf")).max(dim=1).values)
        return vectors[0] if len(vectors) == 1 else torch.cat(vectors, dim=-1)

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` costs in a batch, special tokens included, capped at the max length."""
        counter = self._token_counter()
        return counter.count(text.lower() if self._lowercase else text)

    def token_length(self, text: str, limit: int) -> int:
        """Tokens ``text`` has before truncation, special tokens included, counted no further
        than ``limit``."""
        counter = self._token_counter()
        return counter.length(text.lower() if self._lowercase else text, limit)

    def warmup_inputs(self, max_batch_size: int) -> list[list[str]]:
        return warmup_batches(warmup_text(self.max_seq_length), max_batch_size)

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [
                {
                    "name": "embedding",
                    "datatype": "FP32",
                    "shape": [-1, self.dimension],
                    # Unit vectors or not: the OpenAI door's `dimensions` needs unit vectors.
                    "normalized": self.normalize,
                }
            ],
            **({"engine": self._model.describe()} if self._model is not None else {}),
        }
