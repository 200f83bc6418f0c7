"""The image tasks a model folder may be served as, and the model each builds.

- ``image-classification``: :class:`batching.models.images.ImageClassifier`;
- ``image-text-embedding``: :class:`batching.models.clip.ImageTextEmbedder`, a CLIP-style
  folder's image and text embeddings in one vector space.

No torch at import (the settings read :data:`IMAGE_TASKS`): the models are imported when one
is built.
"""

from __future__ import annotations

from .protocol import Model

__all__ = ["IMAGE_TASKS", "build_image_model"]

IMAGE_TASKS = ("image-classification", "image-text-embedding")


def build_image_model(task: str, folder: str) -> Model:
    """A new, unloaded model of the image task ``task`` from ``folder``."""
    if task == "image-classification":
        from .images import ImageClassifier

        return ImageClassifier(folder)
    if task == "image-text-embedding":
        from .clip import ImageTextEmbedder

        return ImageTextEmbedder(folder)
    raise ValueError(f"{task!r} is not an image task ({', '.join(IMAGE_TASKS)})")
