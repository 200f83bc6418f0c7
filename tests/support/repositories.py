"""Model repositories of several models of different tasks, written as an operator writes them
(one folder with a ``config.toml`` per model), from tiny models saved by the installed
transformers and sentence-transformers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from tests.support import tiny, tiny_tasks, vision
from tests.support.generators import gpt2_folder


def chat_gpt2_folder(root: Path) -> Path:
    """The tiny GPT-2 with a chat template of its own (each message's content, in turn)."""
    import transformers

    folder = gpt2_folder(root, "chat-gpt2")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }} {% endfor %}"
    tokenizer.save_pretrained(folder)
    return folder


def _default(root: Path) -> str:
    del root
    return 'source = "default"\nengine = "torch"\n'


def _task(build: Callable[[Path], Path], task: str) -> Callable[[Path], str]:
    def config(root: Path) -> str:
        return f'source = "{build(root).as_posix()}"\ntask = "{task}"\n'

    return config


def _folder(build: Callable[[Path], Path]) -> Callable[[Path], str]:
    def config(root: Path) -> str:
        return f'source = "{build(root).as_posix()}"\nengine = "torch"\n'

    return config


#: What each model of a mixed repository is: its ``config.toml`` given a folder for sources.
KINDS: dict[str, Callable[[Path], str]] = {
    "embedder": _default,
    "writer": _task(chat_gpt2_folder, "text-generation"),
    "tagger": _task(tiny_tasks.token_classifier_folder, "token-classification"),
    "vision": _task(vision.classifier_folder, "image-classification"),
    "reranker": _task(
        lambda root: tiny.classifier_folder(root, "ce", ["LABEL_0"], seed=3), "text-classification"
    ),
    "splade": _folder(tiny.sparse_encoder_folder),
}


def mixed_repository(root: Path, names: Iterable[str], extra: str = "") -> Path:
    """A repository directory under ``root`` with one folder per name of :data:`KINDS` (the
    folder names sort in the order given); ``extra`` is appended to every ``config.toml``."""
    repository = root / "models"
    sources = root / "sources"
    sources.mkdir(parents=True, exist_ok=True)
    for number, name in enumerate(names):
        folder = repository / f"{number}-{name}"
        folder.mkdir(parents=True)
        (folder / "config.toml").write_text(f'name = "{name}"\n{KINDS[name](sources)}{extra}')
    return repository
