"""image-classification from a local model folder: image bytes in, labels and scores out.

The model's metadata declares its one input as image bytes (``"content": "image"``), so every
door hands it ``bytes`` (a raw ``image/*`` body, base64, KServe v2 BYTES) and the data plane
has checked each image's size and that it decodes before it is queued
(:mod:`batching.models.media`). Nothing here opens a path or fetches a URL: the bytes are
decoded with Pillow (:mod:`..shared.imaging`) and only then given to the pipeline's own steps.

A batch is decoded and preprocessed one image at a time (the image processor resizes each to
the model's size, so only one decoded image is held at once), stacked, and run through the
model in one forward pass. A large image is reduced toward the processor's size as it is
decoded (:func:`~..shared.imaging.decode_image`, by the rule :func:`resize_of` reads from the
processor, which the metadata also declares for the data plane's memory estimate), so what
the processor is handed is never much more than a few times its own output. Each image's
logits then go through the pipeline's own ``postprocess``, so an answer equals
``transformers.pipeline("image-classification")`` for the same image (within a level of 255
of its pixels for an image reduced first). Runs on torch fp32 (the engine checks refuse other
engines and precisions for this task at start-up).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import torch
import transformers

from ..engines.engine_options import EngineOptions
from ..media import RESIZE_KEY
from ..parameters import PARAMETERS_KEY, TaskItem
from ..processors import IMAGE_PROCESSOR, missing_processor
from ..protocol import warmup_batches
from ..shared.imaging import decode_image, sample_png
from ..shared.torch_models import WEIGHTS_LOADING, resolve_device, task_folder
from ..tasks.images import IMAGE_CLASSIFICATION as PARAMETERS
from ..tasks.images import TOP_K

if TYPE_CHECKING:
    from PIL.Image import Image
    from transformers.pipelines.image_classification import ClassificationFunction

__all__ = [
    "IMAGE_CLASSIFICATION",
    "ImageClassifier",
    "ImageProcessor",
    "image_inputs",
    "image_of",
    "resize_of",
]

IMAGE_CLASSIFICATION = "image-classification"


class Label(TypedDict):
    """One of an image's best labels."""

    label: str
    score: float


class ImageProcessor(Protocol):
    """What this package calls of a transformers image processor: one image to its tensors
    (``pixel_values``, ...)."""

    def __call__(self, *, images: Image, return_tensors: str) -> Mapping[str, torch.Tensor]: ...


def image_of(item: object, name: str = "image") -> bytes:
    """The image bytes of one item: bytes, a dict holding them under ``name``, or either in a
    :class:`TaskItem`.

    :raises TypeError: anything else (a path or URL string is never taken)."""
    value = item.input if isinstance(item, TaskItem) else item
    if isinstance(value, dict):
        value = value.get(name)
    if not isinstance(value, bytes):
        raise TypeError(f"an image input is bytes, not {type(value).__name__}")
    return value


def resize_of(image_processor: object) -> dict[str, int]:
    """The image processor's resize rule, as :class:`~..shared.image_budget.Resize` reads it: its
    ``size`` (empty when it does not resize) and its centre crop (``crop_height``,
    ``crop_width``), if it crops."""
    rule: dict[str, int] = {}
    if getattr(image_processor, "do_resize", True):
        size = dict(getattr(image_processor, "size", None) or {})
        rule.update((key, value) for key, value in size.items() if isinstance(value, int))
    crop = dict(getattr(image_processor, "crop_size", None) or {})
    if getattr(image_processor, "do_center_crop", False):
        for key in ("height", "width"):
            if isinstance(crop.get(key), int):
                rule[f"crop_{key}"] = crop[key]
    return rule


def image_inputs(
    image_processor: ImageProcessor, images: list[bytes], device: torch.device
) -> dict[str, torch.Tensor]:
    """The processor's tensors for ``images``, decoded (reduced toward the processor's size)
    and processed one at a time (at most one decoded image in memory), stacked into one batch
    on ``device``."""
    parts: dict[str, list[torch.Tensor]] = {}
    resize = resize_of(image_processor)
    for data in images:
        processed = image_processor(images=decode_image(data, resize=resize), return_tensors="pt")
        for key, tensor in processed.items():
            parts.setdefault(key, []).append(tensor)
    return {key: torch.cat(tensors).to(device) for key, tensors in parts.items()}


def _function(name: object) -> ClassificationFunction | None:
    """The pipeline's ``ClassificationFunction`` named ``name``; None: the model decides."""
    if not isinstance(name, str):
        return None
    from transformers.pipelines.image_classification import ClassificationFunction

    return ClassificationFunction(name)


class ImageClassifier:
    """``image-classification``: one ``[{"label", "score"}, ...]`` list per image, best first.

    :param task: ``image-classification`` (the task table builds every task's model alike).
    :param path: the model folder (config, weights and the image processor, saved alone or
        in its processor's ``processor_config.json``).
    :param engine: torch fp32 is the only engine of this task (the start-up checks refuse
        another), so it is not read.
    """

    def __init__(
        self,
        task: str = IMAGE_CLASSIFICATION,
        path: str | os.PathLike[str] = "",
        engine: EngineOptions | None = None,
    ) -> None:
        self.path = task_folder(path, task, IMAGE_CLASSIFICATION, "ImageClassifier")
        # transformers' pipeline, whose methods are untyped.
        self._pipeline: Any = None
        self._device = torch.device("cpu")

    def load(self, device: str) -> None:
        self._device = resolve_device(device)
        with WEIGHTS_LOADING:
            pipe: Any = transformers.pipeline(
                "image-classification", model=str(self.path), device=self._device
            )
        if getattr(pipe, "image_processor", None) is None:
            raise ValueError(missing_processor(self.path, IMAGE_PROCESSOR, IMAGE_CLASSIFICATION))
        pipe.model.eval()
        self._pipeline = pipe

    def predict(self, inputs: Sequence[object]) -> list[list[Label]]:
        pipe = self._pipeline
        if pipe is None:
            raise RuntimeError("ImageClassifier.predict called before load()")
        if not inputs:
            return []
        batch = image_inputs(
            pipe.image_processor, [image_of(item) for item in inputs], self._device
        )
        with torch.inference_mode():
            logits = pipe.model(**batch).logits.float().cpu()
        outputs: list[list[Label]] = []
        for index, item in enumerate(inputs):
            # Both parameters change the post-processing alone: one forward pass for all.
            options = dict(item.parameters) if isinstance(item, TaskItem) else {}
            answer = pipe.postprocess(
                {"logits": logits[index : index + 1]},
                top_k=options.get(TOP_K.name, TOP_K.default),
                function_to_apply=_function(options.get("function_to_apply")),
            )
            outputs.append([{"label": str(a["label"]), "score": float(a["score"])} for a in answer])
        return outputs

    def warmup_inputs(self, max_batch_size: int) -> list[list[bytes]]:
        """A generated image at batch 1 and at the cap: decoded, processed and classified
        before the instance reports ready."""
        return warmup_batches(sample_png(), max_batch_size)

    def metadata(self) -> dict[str, object]:
        image: dict[str, object] = {
            "name": "image",
            "datatype": "BYTES",
            "shape": [-1],
            "content": "image",
        }
        if self._pipeline is not None:
            image[RESIZE_KEY] = resize_of(self._pipeline.image_processor)
        described: dict[str, object] = {
            "inputs": [image],
            # A list of {"label", "score"} per image, as JSON text.
            "outputs": [{"name": "output", "datatype": "BYTES", "shape": [-1]}],
            PARAMETERS_KEY: {param.name: param.describe() for param in PARAMETERS},
        }
        if self._pipeline is not None:
            id2label = self._pipeline.model.config.id2label or {}
            described["labels"] = [str(id2label[index]) for index in sorted(id2label)]
        return described
