"""``image-text-embedding``: a CLIP-style folder's image and text embeddings, in one space.

The folder holds a ``CLIPModel`` (``model_type`` ``clip``: ``get_image_features`` and
``get_text_features``), its tokenizer and its image processor. Other two-tower models are
refused: SigLIP's text tower, for one, pools its last position, so texts padded to the longest
of a batch would get vectors that depend on what they were batched with. Each
item is exactly one of two named inputs: ``text`` (a string) or ``image`` (bytes, declared
``"content": "image"``, so every door hands the model bytes and never a path or URL). A text
gets ``get_text_features``, an image ``get_image_features``: vectors of the same width in the
same space, so a text's vector can be compared with an image's (cosine similarity, as CLIP
was trained). They are returned as the model computes them, not normalised.

A batch is split into its texts and its images, each run as one forward pass, and the vectors
put back in order. Text comes first in the metadata, so a lone string stands for a text on the
plain door and ``/v1/embeddings`` serves this model's text embeddings. Runs on torch fp32.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch
import transformers
from transformers import BatchEncoding, PreTrainedTokenizerBase

from ..engines.engine_options import EngineOptions
from ..media import RESIZE_KEY
from ..parameters import TaskItem
from ..shared.imaging import sample_png
from ..shared.torch_models import (
    WEIGHTS_LOADING,
    max_length_of,
    read_config,
    resolve_device,
    task_folder,
    to_numpy,
)
from .classifier import ImageProcessor, image_inputs, resize_of

__all__ = ["IMAGE_TEXT_EMBEDDING", "ImageTextEmbedder"]

IMAGE_TEXT_EMBEDDING = "image-text-embedding"


class TwoTowers(Protocol):
    """What this package calls of a CLIP-style model: each tower's projected vectors."""

    def get_text_features(
        self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> object: ...

    def get_image_features(self, **pixels: torch.Tensor) -> object: ...


def _split(item: object) -> tuple[str | None, bytes | None]:
    """``(text, image)`` of one item, exactly one of them set."""
    value = item.input if isinstance(item, TaskItem) else item
    if isinstance(value, str):
        return value, None
    if isinstance(value, bytes):
        return None, value
    if isinstance(value, dict):
        text, image = value.get("text"), value.get("image")
        if isinstance(text, str) and image is None:
            return text, None
        if isinstance(image, bytes) and text is None:
            return None, image
    raise TypeError("an item is a text (str) or an image (bytes), exactly one of them")


def _features(output: object) -> torch.Tensor:
    """The projected vectors of a ``get_*_features`` call: a tensor, or (in some versions and
    models) an output object holding them as its pooler output."""
    if isinstance(output, torch.Tensor):
        return output
    pooled = getattr(output, "pooler_output", None)
    if isinstance(pooled, torch.Tensor):
        return pooled
    raise TypeError(f"get_*_features returned {type(output).__name__}, not vectors")


class ImageTextEmbedder:
    """Image and text embeddings from a CLIP-style folder.

    :param task: ``image-text-embedding`` (the task table builds every task's model alike).
    :param path: the folder (config, weights, tokenizer, image processor).
    :param engine: torch fp32 is the only engine of this task (the start-up checks refuse
        another), so it is not read.
    """

    def __init__(
        self,
        task: str = IMAGE_TEXT_EMBEDDING,
        path: str | os.PathLike[str] = "",
        engine: EngineOptions | None = None,
    ) -> None:
        self.path = task_folder(path, task, IMAGE_TEXT_EMBEDDING, "ImageTextEmbedder")
        self._config = read_config(self.path / "config.json")
        model_type = self._config.get("model_type")
        if model_type != "clip":
            raise ValueError(
                f"{IMAGE_TEXT_EMBEDDING} serves CLIP folders (config.json model_type clip); "
                f"{self.path.name} is {model_type!r}"
            )
        self._model: TwoTowers | None = None
        self._processor: ImageProcessor | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._device = torch.device("cpu")
        #: The longest text in tokens: CLIP's 77 until the tokenizer and the text tower's
        #: positions say (:func:`~..shared.text_models.max_length_of`).
        self.max_seq_length = 77
        width = self._config.get("projection_dim")
        self.width = width if isinstance(width, int) else None

    def load(self, device: str) -> None:
        self._device = resolve_device(device)
        with WEIGHTS_LOADING:
            model = transformers.AutoModel.from_pretrained(str(self.path))
        if not all(hasattr(model, name) for name in ("get_image_features", "get_text_features")):
            raise ValueError(
                f"{self.path}: {type(model).__name__} has no get_image_features and "
                "get_text_features; image-text-embedding serves CLIP-style models"
            )
        self._tokenizer_ready()
        auto: Any = transformers.AutoImageProcessor  # its from_pretrained is untyped
        self._processor = auto.from_pretrained(str(self.path))
        module: torch.nn.Module = model  # torch's typed methods; .to moves a module in place
        module.to(self._device).eval()
        self._model = model

    def _tokenizer_ready(self) -> PreTrainedTokenizerBase:
        """The tokenizer, loaded the first time (the deployment's counting copy of the model
        is never loaded), with the longest text it may give the model."""
        if self._tokenizer is None:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.path))
            self.max_seq_length = max_length_of(tokenizer, self._config.get("text_config") or {})
            self._tokenizer = tokenizer
        return self._tokenizer

    def predict(self, inputs: Sequence[object]) -> np.ndarray:
        model, processor = self._model, self._processor
        if model is None or processor is None:
            raise RuntimeError("ImageTextEmbedder.predict called before load()")
        split = [_split(item) for item in inputs]
        texts = [(index, text) for index, (text, _) in enumerate(split) if text is not None]
        images = [(index, image) for index, (_, image) in enumerate(split) if image is not None]
        rows: dict[int, np.ndarray] = {}
        with torch.inference_mode():
            if texts:
                encoded: BatchEncoding = self._tokenizer_ready()(
                    [text for _, text in texts],
                    padding=True,
                    truncation=True,
                    max_length=self.max_seq_length,
                    return_tensors="pt",
                )
                encoded = encoded.to(self._device)
                features = model.get_text_features(
                    input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]
                )
                vectors = to_numpy(_features(features))
                rows.update(zip((index for index, _ in texts), vectors, strict=True))
            if images:
                batch = image_inputs(processor, [data for _, data in images], self._device)
                vectors = to_numpy(_features(model.get_image_features(**batch)))
                rows.update(zip((index for index, _ in images), vectors, strict=True))
        return np.stack([rows[index] for index in range(len(inputs))]).astype(np.float32)

    def count_tokens(self, item: object) -> int:
        """A text's tokens (capped at the model's maximum length); 1 for an image."""
        text, _ = _split(item)
        if text is None:
            return 1
        ids = self._tokenizer_ready()(text, truncation=True, max_length=self.max_seq_length)[
            "input_ids"
        ]
        return len(ids)

    def warmup_inputs(self, max_batch_size: int) -> list[list[Mapping[str, str | bytes]]]:
        """A generated image and a text, each at batch 1, and both kinds mixed at the cap:
        each forward pass runs before the instance reports ready."""
        image: Mapping[str, str | bytes] = {"image": sample_png()}
        text: Mapping[str, str | bytes] = {"text": "a photo of a cat"}
        full = [image if index % 2 else text for index in range(max_batch_size)]
        return [[image], [text], full]

    def metadata(self) -> dict[str, object]:
        width = self.width if isinstance(self.width, int) else -1
        image: dict[str, object] = {
            "name": "image",
            "datatype": "BYTES",
            "shape": [-1],
            "optional": True,
            "exclusive": True,
            "content": "image",
        }
        if self._processor is not None:
            image[RESIZE_KEY] = resize_of(self._processor)
        return {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [-1],
                    "optional": True,
                    "exclusive": True,
                },
                image,
            ],
            # get_text_features / get_image_features as the model computes them.
            "outputs": [
                {"name": "embedding", "datatype": "FP32", "shape": [-1, width], "normalized": False}
            ],
        }
