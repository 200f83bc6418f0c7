"""Tiny randomly initialised image models written to a folder, for tests that serve them
offline in milliseconds: a ViT image classifier and a CLIP model, each with its image
processor (and CLIP's tokenizer) saved beside it, as a real folder holds them."""

from __future__ import annotations

import io
import os
from pathlib import Path

# Before transformers is imported: nothing here may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402

SIZE = 32
LABELS = ["cat", "dog", "bird", "fish", "tree", "car"]
WORDS = ["a", "photo", "of", "the", "cat", "dog", "bird", "red", "blue", "car", "tree"]


class ImageOnlyProcessor(transformers.ProcessorMixin):
    """A processor of one part, an image processor: saved, its ``processor_config.json``
    holds the image processor (and no ``preprocessor_config.json`` is written)."""

    attributes = ["image_processor"]
    image_processor_class = "AutoImageProcessor"

    def __init__(self, image_processor: object) -> None:
        super().__init__(image_processor)


def classifier_folder(
    root: Path, name: str = "vit", size: int = SIZE, *, processor: bool = False
) -> Path:
    """A ViT image classifier over :data:`LABELS`, ``size`` x ``size`` inputs (32); its image
    processor saved alone, or with ``processor`` inside a processor's
    ``processor_config.json``."""
    folder = root / name
    torch.manual_seed(3)
    config = transformers.ViTConfig(
        image_size=size,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        initializer_range=0.5,
        id2label=dict(enumerate(LABELS)),
        label2id={label: index for index, label in enumerate(LABELS)},
    )
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    image_processor = transformers.ViTImageProcessor(size={"height": size, "width": size})
    if processor:
        ImageOnlyProcessor(image_processor).save_pretrained(folder)
    else:
        image_processor.save_pretrained(folder)
    return folder


def _clip_tokenizer(folder: Path) -> transformers.BertTokenizerFast:
    """A word-level tokenizer: ``[CLS]`` opens a text and ``[SEP]`` ends it, where CLIP's text
    tower pools (its ``eos_token_id``)."""
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return transformers.BertTokenizerFast(vocab=str(vocab), do_lower_case=True)


def clip_folder(root: Path, name: str = "clip", *, processor: bool = False) -> Path:
    """A CLIP model (text and vision towers, 16-dimensional projections), its tokenizer and
    its image processor, saved apart, or with ``processor`` as one ``CLIPProcessor`` (whose
    ``processor_config.json`` holds the image processor)."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _clip_tokenizer(folder)
    torch.manual_seed(5)
    config = transformers.CLIPConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": 32,
            "eos_token_id": tokenizer.sep_token_id,
            "bos_token_id": tokenizer.cls_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "image_size": SIZE,
            "patch_size": 8,
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
        },
        projection_dim=16,
    )
    transformers.CLIPModel(config).save_pretrained(folder)
    tokenizer.model_max_length = 32
    image_processor = transformers.CLIPImageProcessor(
        size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE}
    )
    if processor:
        transformers.CLIPProcessor(
            image_processor=image_processor, tokenizer=tokenizer
        ).save_pretrained(folder)
        return folder
    tokenizer.save_pretrained(folder)
    image_processor.save_pretrained(folder)
    return folder


def png(width: int, height: int, seed: int) -> bytes:
    """A PNG of random pixels (seeded), ``width`` x ``height``."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(buffer, format="PNG")
    return buffer.getvalue()
