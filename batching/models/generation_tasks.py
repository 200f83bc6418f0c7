"""The generating tasks' names and answer keys (pure: read at start-up without torch)."""

from __future__ import annotations

import re

__all__ = ["GENERATION_TASKS", "SEQ2SEQ_TASKS", "is_generation_task", "is_seq2seq_task", "pair_of"]

#: The encoder-decoder tasks, and the key of their answers.
SEQ2SEQ_TASKS = {
    "summarization": "summary_text",
    "translation": "translation_text",
    "text2text-generation": "generated_text",
}
#: Every generating task, and the key of its answers.
GENERATION_TASKS = {"text-generation": "generated_text", **SEQ2SEQ_TASKS}

_PAIR = re.compile(r"^translation_([A-Za-z-]+)_to_([A-Za-z-]+)$")


def pair_of(task: str) -> tuple[str, str] | None:
    """The languages ``translation_<src>_to_<tgt>`` names (None: not that spelling)."""
    found = _PAIR.match(task)
    return None if found is None else (found.group(1), found.group(2))


def is_seq2seq_task(task: str) -> bool:
    """Whether ``task`` is an encoder-decoder task (``translation_xx_to_yy`` included)."""
    return task in SEQ2SEQ_TASKS or pair_of(task) is not None


def is_generation_task(task: str) -> bool:
    """Whether ``task`` is served by a generator."""
    return task == "text-generation" or is_seq2seq_task(task)
