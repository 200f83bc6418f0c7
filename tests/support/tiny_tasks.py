"""Tiny randomly initialised models of the text tasks that ``tests/support/tiny.py`` has no
folder for (token classification), built from a config in a temporary folder."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from tests.support.tiny import bert_config, masked_folder

__all__ = ["TAGS", "masked_folder", "token_classifier_folder"]

#: The token classifier's labels, BIO-style, as NER models name them.
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def token_classifier_folder(root: Path, name: str = "tagger") -> Path:
    """A token classifier with :data:`TAGS` and a fast tokenizer (for every aggregation)."""
    from tests.support.tiny import _tokenizer

    folder = root / name
    torch.manual_seed(3)
    config = bert_config(
        id2label=dict(enumerate(TAGS)), label2id={label: i for i, label in enumerate(TAGS)}
    )
    transformers.BertForTokenClassification(config).save_pretrained(folder)
    _tokenizer(folder, root)
    return folder
