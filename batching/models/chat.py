"""A chat as a generating model's input: the messages of an OpenAI chat request, which the
model turns into its prompt with its tokenizer's chat template (pure data)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Chat"]


@dataclass(frozen=True, slots=True)
class Chat:
    """The messages of a chat, in order: ``(role, content)`` pairs."""

    messages: tuple[tuple[str, str], ...]
    #: What the request gives the template to read (``chat_template_kwargs``, checked).
    kwargs: tuple[tuple[str, object], ...] = ()

    def as_messages(self) -> list[dict[str, str]]:
        """The messages as a chat template takes them."""
        return [{"role": role, "content": content} for role, content in self.messages]
