"""SPLADE sparse embeddings the way sentence-transformers' ``SparseEncoder`` computes them,
with plain transformers and the engine plan."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TypeAlias

import numpy as np
import torch
import transformers
from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase

from ..engines.engine_options import EngineOptions
from ..engines.job import EngineJob
from ..engines.plan import EnginePlan
from ..engines.selection import select_engine
from ..items import EMBEDDING_KEY, EmbedItem, SparseVector
from ..protocol import warmup_batches
from ..shared.text_models import LazyCounter
from ..shared.torch_models import (
    TokenCounter,
    calibration_texts,
    encode,
    load_eval,
    read_config,
    resolve_device,
    to_numpy,
    warmup_text,
)
from . import tokenizing
from .splade import SpladeLayout, read_layout

__all__ = ["SparseEmbedder"]

#: What an item tokenises (prompt included), and its prompt when it is cut at its start.
_Prepared: TypeAlias = tuple[str, str | None]


class SparseEmbedder:
    """SPLADE sparse vectors from a masked language model, equal to sentence-transformers'
    ``SparseEncoder.encode``: tokenise (truncated at ``max_seq_length``), run the masked LM
    for its vocabulary logits, zero the padding, apply ``log1p(relu(x))`` (a second log1p
    for ``log1p_relu``), pool over the tokens (max, or sum), and keep the largest
    ``max_active_dims`` values when the folder sets it.

    ``predict`` takes texts (the folder's default prompt prepended) and
    :class:`~batching.models.items.EmbedItem` items (their own prompt, truncation side;
    output ``"sparse"``; cut at its start, a text keeps its prompt and special tokens) and
    returns one :class:`~batching.models.items.SparseVector` per item: its non-zero
    entries, indices ascending, with their vocabulary tokens.

    :param path: a SparseEncoder folder, or any masked-LM folder (``--task
        sparse-embedding``).
    :param engine: what runs the masked LM (:mod:`batching.models.engines`): head
        ``masked-lm``, checked on the pooled vectors. None: torch, fp32.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        engine: EngineOptions | None = None,
    ) -> None:
        self.path = Path(path)
        self.name = self.path.resolve().name
        self.layout: SpladeLayout = read_layout(self.path)
        self._folder = self.layout.transformer
        self._config = read_config(self._folder / "config.json")
        vocab = self._config.get("vocab_size")
        self.vocab_size: int = vocab if isinstance(vocab, int) else -1
        self.engine = engine or EngineOptions(engine="torch", precision="fp32")
        self._device = torch.device("cpu")
        self._plan: EnginePlan | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._counting = LazyCounter(self._folder, self.layout.max_seq_length)

    @property
    def max_seq_length(self) -> int:
        return self._counting.resolved_max_length()

    def _token_counter(self) -> TokenCounter:
        return self._counting.counter()

    def load(self, device: str) -> None:
        self._device = resolve_device(device)
        tokenizer = self._tokenizer = transformers.AutoTokenizer.from_pretrained(str(self._folder))
        self._counting.resolve(tokenizer, self._config)
        self._plan = select_engine(
            EngineJob(
                options=self.engine,
                folder=self._folder,
                head="masked-lm",
                measure="embedding",
                device=str(self._device),
                input_names=tuple(tokenizer(["a"], return_tensors="pt").keys()),
                load_reference=self._load_reference,
                view=self._view,
                calibration=self._calibration,
                sample=self._sample,
            )
        )

    def _loaded(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            raise RuntimeError("SparseEmbedder used before load()")
        return self._tokenizer

    def _load_reference(self) -> PreTrainedModel:
        return load_eval(transformers.AutoModelForMaskedLM, self._folder, self._device)

    def _text(self, item: object) -> _Prepared:
        """What ``item`` tokenises (prompt included), and its prompt when it is cut at its
        start (None: cut at its end)."""
        if isinstance(item, str):
            text, prompt = self.layout.default_prompt + item, None
        elif isinstance(item, EmbedItem):
            if item.output != "sparse":
                raise TypeError(f"this sparse model returns sparse vectors, not {item.output!r}")
            text = item.prompt + item.text
            prompt = item.prompt if item.truncate_left else None
        else:
            raise TypeError(f"expected a text or an EmbedItem, got {type(item).__name__}")
        if self.layout.lowercase:
            return text.lower(), None if prompt is None else prompt.lower()
        return text, prompt

    def _encode(self, texts: Sequence[str]) -> BatchEncoding:
        return encode(self._loaded(), texts, self.max_seq_length, self._device)

    def _encode_left(self, texts: Sequence[str], prompts: Sequence[str]) -> BatchEncoding:
        """Cut at their start, keeping each text's prompt and the special tokens, as the
        sentence embedder does (:func:`~batching.models.embedding.tokenizing.encode_left`)."""
        tokenizer = self._loaded()
        lengths = [tokenizing.prompt_length(tokenizer, prompt) for prompt in prompts]
        rows = tokenizing.encode_left(tokenizer, texts, lengths, self.max_seq_length)
        padded = tokenizer.pad(rows, padding=True, return_tensors="pt")
        return padded.to(self._device) if self._device.type != "cpu" else padded

    def _calibration(self) -> list[BatchEncoding]:
        texts = calibration_texts(self.max_seq_length)
        return [self._encode(texts), self._encode(texts[-1:])]

    def _sample(self, size: int) -> BatchEncoding:
        return self._encode([warmup_text(self.max_seq_length)] * size)

    def _view(self, logits: torch.Tensor, encoded: BatchEncoding) -> np.ndarray:
        with torch.inference_mode():
            return to_numpy(self._pool(logits, encoded["attention_mask"]))

    def _pool(self, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """SpladePooling's forward: padding zeroed, log1p(relu), pooled over the tokens."""
        logits = torch.as_tensor(logits)  # ONNX Runtime and OpenVINO answer in numpy
        scores = torch.log1p(torch.relu(logits * mask.unsqueeze(-1).to(logits.dtype)))
        if self.layout.activation == "log1p_relu":
            scores = torch.log1p(scores)
        if self.layout.pooling == "max":
            return scores.max(dim=1).values
        return scores.sum(dim=1)

    def _keep_largest(self, pooled: torch.Tensor) -> torch.Tensor:
        """sentence-transformers' ``select_max_active_dims``: the top-k values, others 0."""
        k = self.layout.max_active_dims
        if k is None or k >= pooled.shape[-1]:
            return pooled
        top = torch.topk(pooled.abs(), k, dim=-1).indices
        kept = torch.zeros_like(pooled)
        return kept.scatter(-1, top, pooled.gather(-1, top))

    def unload(self) -> None:
        """Stop the engine plan's background threads (idle release, retake)."""
        if self._plan is not None:
            self._plan.close()

    def predict(self, inputs: Sequence[object]) -> list[SparseVector]:
        if self._plan is None:
            raise RuntimeError("SparseEmbedder.predict called before load()")
        prepared = [self._text(item) for item in inputs]
        right = [i for i, (_, prompt) in enumerate(prepared) if prompt is None]
        left = [(i, prompt) for i, (_, prompt) in enumerate(prepared) if prompt is not None]
        vectors: dict[int, SparseVector] = {}
        if right:
            encoded = self._encode([prepared[i][0] for i in right])
            vectors.update(zip(right, self._vectors(encoded), strict=True))
        if left:
            texts = [prepared[i][0] for i, _ in left]
            encoded = self._encode_left(texts, [prompt for _, prompt in left])
            vectors.update(zip((i for i, _ in left), self._vectors(encoded), strict=True))
        return [vectors[position] for position in range(len(inputs))]

    def _vectors(self, encoded: BatchEncoding) -> list[SparseVector]:
        with torch.inference_mode():
            assert self._plan is not None
            pooled = self._keep_largest(self._pool(self._plan(encoded), encoded["attention_mask"]))
            dense = to_numpy(pooled)
        vectors = []
        for row in dense:
            indices = np.flatnonzero(row).astype(np.int64)
            tokens = tuple(self._loaded().convert_ids_to_tokens(indices.tolist()))
            vectors.append(SparseVector(indices, row[indices].astype(np.float32), tokens))
        return vectors

    def count_tokens(self, item: object) -> int:
        """Tokens ``item`` costs in a batch (prompt and special tokens included), capped at
        the max length."""
        return self._token_counter().count(self._text(item)[0])

    def token_length(self, item: object, limit: int) -> int:
        """Tokens ``item`` has before truncation, counted no further than ``limit``."""
        return self._token_counter().length(self._text(item)[0], limit)

    def warmup_inputs(self, max_batch_size: int) -> list[list[str]]:
        return warmup_batches(warmup_text(self.max_seq_length), max_batch_size)

    def metadata(self) -> dict[str, object]:
        layout = self.layout
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            # Padded rows: each row's non-zeros first, then index -1 and value 0 up to the
            # longest row of the batch (see "sparse").
            "outputs": [
                {"name": "indices", "datatype": "INT64", "shape": [-1, -1]},
                {"name": "values", "datatype": "FP32", "shape": [-1, -1]},
            ],
            "sparse": {
                "vocab_size": self.vocab_size,
                "padding": {"indices": -1, "values": 0.0},
                "pooling": layout.pooling,
                "activation": layout.activation,
                "max_active_dims": layout.max_active_dims,
            },
            EMBEDDING_KEY: {
                "prompts": dict(layout.prompts),
                "default_prompt_name": layout.default_prompt_name,
                "default_prompt": layout.default_prompt,
                "max_seq_length": self.max_seq_length,
                "normalized": False,
                "outputs": ["sparse"],
                "encodings": ["float"],
                "truncation_directions": ["right", "left"],
                "tokenize": False,
                "vocab_size": self.vocab_size,
            },
            **({"engine": self._plan.describe()} if self._plan is not None else {}),
        }
