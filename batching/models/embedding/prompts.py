"""Instruction prompts: what a sentence-transformers folder declares in
``config_sentence_transformers.json`` (``prompts``, ``default_prompt_name``), and the default
prompt the server applies once ``--default-prompt-name`` / ``--default-prompt`` have had their
say.

Pure: reads one JSON file, imports no ML library, so a bad prompt setting stops the start-up
with one line before anything heavy loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "PROMPTS_FILE",
    "PromptConfigError",
    "PromptOptions",
    "Prompts",
    "read_prompts",
]

#: Where a sentence-transformers folder keeps its prompts.
PROMPTS_FILE = "config_sentence_transformers.json"


class PromptConfigError(ValueError):
    """A prompt setting that cannot be applied; the message says what the choices are."""


@dataclass(frozen=True, slots=True)
class PromptOptions:
    """The operator's override of a folder's default prompt (picklable, handed to the model at
    build time). At most one is set: ``name``, one of the folder's prompts, or ``text``, a
    literal prefix (``""`` turns the folder's default off)."""

    name: str | None = None
    text: str | None = None

    def __post_init__(self) -> None:
        if self.name is not None and self.text is not None:
            raise PromptConfigError(
                "--default-prompt-name and --default-prompt are mutually exclusive: give one"
            )

    @property
    def given(self) -> bool:
        return self.name is not None or self.text is not None


@dataclass(frozen=True, slots=True)
class Prompts:
    """A folder's prompts and the effective default, overrides applied.

    :param prompts: name -> text, as the folder declares them (``{}`` if none).
    :param default_name: the effective default prompt's name (None: none, or a literal one).
    :param default: the effective default prompt's text, prepended to every plain text
        (``""``: none), as ``SentenceTransformer.encode`` prepends ``default_prompt_name``'s.
    """

    prompts: dict[str, str] = field(default_factory=dict)
    default_name: str | None = None
    default: str = ""

    def known(self) -> str:
        """The known names, for messages."""
        return (
            ", ".join(sorted(self.prompts))
            if self.prompts
            else "none (the folder declares no prompts)"
        )


def read_prompts(
    folder: Path, options: PromptOptions | None = None, name: str | None = None
) -> Prompts:
    """The prompts ``folder`` declares and the effective default under ``options``.

    :param name: the model as messages name it (default: the folder's name).

    :raises PromptConfigError: for an unreadable file, a name (the folder's own default or
        ``options.name``) that is not among the prompts.
    """
    label = name or folder.name
    declared, folder_default = _declared(folder, label)
    options = options or PromptOptions()
    if options.text is not None:
        return Prompts(declared, None, options.text)
    if options.name is not None:
        if options.name not in declared:
            raise PromptConfigError(
                f"--default-prompt-name {options.name!r} is not a prompt of {label}; "
                f"known: {Prompts(declared).known()}"
            )
        return Prompts(declared, options.name, declared[options.name])
    if folder_default is None:
        return Prompts(declared)
    if folder_default not in declared:
        raise PromptConfigError(
            f"{label}/{PROMPTS_FILE}: default_prompt_name {folder_default!r} is not among "
            f"its prompts (known: {Prompts(declared).known()}); fix the file or override it with "
            "--default-prompt-name or --default-prompt"
        )
    return Prompts(declared, folder_default, declared[folder_default])


def _declared(folder: Path, label: str) -> tuple[dict[str, str], str | None]:
    path = folder / PROMPTS_FILE
    if not path.is_file():
        return {}, None
    try:
        data: object = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PromptConfigError(f"{label}/{PROMPTS_FILE} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise PromptConfigError(f"{label}/{PROMPTS_FILE} is not a JSON object")
    prompts = data.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in prompts.items()
    ):
        raise PromptConfigError(f"{label}/{PROMPTS_FILE}: prompts must map names to texts")
    default = data.get("default_prompt_name")
    if default is not None and not isinstance(default, str):
        raise PromptConfigError(f"{label}/{PROMPTS_FILE}: default_prompt_name must be a string")
    return dict(prompts), default or None
