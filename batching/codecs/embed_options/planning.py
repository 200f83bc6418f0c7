"""Planning an embedding request: its options (:mod:`.reading`) checked against what the model
says it applies (its ``"embedding"`` metadata), into the items its queue takes and the plan of
the answer (:class:`EmbedPlan`): 400 for an option the model cannot apply, 413 for a text over
the model's length that the request does not let it cut."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from batching.documents import listed
from batching.errors import InvalidRequest, PayloadTooLarge
from batching.models.items import EMBEDDING_KEY, EmbedItem

from ..capability import first_output, max_seq_length
from .reading import INPUT_TYPE_ALIASES, EmbedOptions, OptionError

__all__ = [
    "EmbedPlan",
    "TextTooLong",
    "check_dimensions",
    "embedding_info",
    "plan_embedding",
    "refused_text",
    "resolve_prompt",
    "too_long",
    "truncated_flags",
]


class TextTooLong(PayloadTooLarge):
    """A text over the model's length, with ``truncate: false`` (413)."""


def embedding_info(metadata: Mapping[str, object]) -> Mapping[str, object] | None:
    """The model's ``"embedding"`` metadata, or None when it declares none."""
    info = metadata.get(EMBEDDING_KEY)
    return info if isinstance(info, Mapping) else None


def _width(metadata: Mapping[str, object]) -> int | None:
    output = first_output(metadata)
    shape = output.get("shape") if output is not None else None
    width = shape[-1] if isinstance(shape, list) and shape else None
    return width if isinstance(width, int) and not isinstance(width, bool) and width > 0 else None


def _normalized(metadata: Mapping[str, object], info: Mapping[str, object] | None) -> bool:
    if info is not None and isinstance(info.get("normalized"), bool):
        return bool(info["normalized"])
    output = first_output(metadata)
    return output is not None and output.get("normalized") is True


@dataclass(frozen=True, slots=True)
class EmbedPlan:
    """What the door sends and how it shapes the answer, for one request."""

    #: One per text: the text itself (the model's defaults) or an :class:`EmbedItem`.
    items: list[str | EmbedItem]
    options: EmbedOptions
    #: Whether an over-long text is cut (True) or refused (False).
    truncate: bool
    #: The model's length in tokens, when it declares one: texts over it are truncated.
    max_seq_length: int | None
    #: ``dimensions`` the door applies itself (float vectors of models that do not).
    door_dimensions: int | None
    normalized: bool
    #: Whether the model declares ``"embedding"`` metadata (usage and truncation are known).
    described: bool = False

    def token_limit(self, at_least: int = 0) -> int | None:
        """The ``limit`` to count each text's length with: one past the model's length, so
        that a count over it says the text was truncated."""
        if self.max_seq_length is None:
            return at_least or None
        return max(self.max_seq_length + 1, at_least)


def _not_applied(model: str, option: str, value: object, why: str) -> OptionError:
    return OptionError(f"model {model!r} cannot apply {option}={value!r}: {why}", param=option)


def resolve_prompt(
    prompt_name: str | None, input_type: str | None, info: Mapping[str, object], model: str | None
) -> str | None:
    """The prompt text ``prompt_name`` or ``input_type`` picks among the model's ``prompts``
    (its ``"embedding"`` metadata), or None for the model's default: for dense, per-token and
    sparse vectors alike.

    :raises OptionError: a name the model has no prompt for (listing its prompts), or the two
        picking different prompts.
    """
    prompts = info.get("prompts") or {}
    if not isinstance(prompts, Mapping):
        prompts = {}
    known = ", ".join(repr(name) for name in prompts) or "none"
    subject = "the model" if model is None else f"model {model!r}"
    chosen = prompt_name
    if chosen is not None and chosen not in prompts:
        raise OptionError(
            f"unknown prompt_name {chosen!r}: {subject} has no prompt named {chosen!r}; its "
            f"prompts: {known}",
            param="prompt_name",
        )
    if input_type is not None:
        candidates = (input_type, *INPUT_TYPE_ALIASES.get(input_type, ()))
        by_type = next((name for name in candidates if name in prompts), None)
        if by_type is None:
            raise OptionError(
                f"{subject} has no prompt for input_type {input_type!r}; its prompts: {known}",
                param="input_type",
            )
        if chosen is not None and chosen != by_type:
            raise OptionError(
                f"prompt_name {chosen!r} and input_type {input_type!r} choose different "
                "prompts; send one of them",
                param="input_type",
            )
        chosen = by_type
    return None if chosen is None else str(prompts[chosen])


def plan_embedding(
    texts: Sequence[str],
    options: EmbedOptions,
    metadata: Mapping[str, object],
    *,
    model: str,
    truncate_default: bool = True,
    encoding_name: str = "encoding",
) -> EmbedPlan:
    """The items for ``texts`` with ``options``, given the model's ``metadata``.

    A request whose options are all the model's defaults sends the texts themselves (the
    fast path); any other sends one :class:`EmbedItem` per text, its prompt resolved.

    :param encoding_name: the door's name of ``encoding`` (``encoding_format``), for messages.
    :raises OptionError: an option the model cannot apply, naming it; an unknown prompt
        name, listing the model's prompts.
    """
    info = embedding_info(metadata)
    width = _width(metadata)
    normalized = _normalized(metadata, info)
    truncate = truncate_default if options.truncate is None else options.truncate
    check_dimensions(options.dimensions, width, normalized, model)
    if info is None:
        return _plan_undescribed(texts, options, model, normalized, encoding_name)

    outputs = listed(info.get("outputs")) or ["dense"]
    if "dense" not in outputs:
        raise InvalidRequest(f"model {model!r} does not return dense embeddings")
    prompt = resolve_prompt(options.prompt_name, options.input_type, info, model)
    directions = [str(name) for name in listed(info.get("truncation_directions"))] or ["right"]
    direction = options.truncation_direction or "right"
    if direction not in directions:
        raise _not_applied(
            model, "truncation_direction", direction, f"it truncates {', '.join(directions)}"
        )
    encodings = [str(name) for name in listed(info.get("encodings"))] or ["float"]
    if options.encoding not in encodings:
        raise _not_applied(
            model, encoding_name, options.wire_encoding, f"its encodings are {', '.join(encodings)}"
        )
    max_length = max_seq_length(metadata)

    compact = options.encoding != "float"
    # Shortening float vectors stays the door's (the fast path keeps plain strings); a compact
    # encoding quantizes after shortening, so the model does both.
    model_dimensions = options.dimensions if compact and options.dimensions != width else None
    door_dimensions = None if compact else options.dimensions
    default_prompt = info.get("default_prompt") or ""
    items: list[str | EmbedItem]
    if (prompt is None or prompt == default_prompt) and direction == "right" and not compact:
        items = list(texts)
    else:
        resolved = default_prompt if prompt is None else prompt
        items = [
            EmbedItem(
                text,
                prompt=str(resolved),
                truncate_left=direction == "left",
                dimensions=model_dimensions,
                encoding=options.encoding,
            )
            for text in texts
        ]
    return EmbedPlan(
        items=items,
        options=options,
        truncate=truncate,
        max_seq_length=max_length,
        door_dimensions=door_dimensions,
        normalized=normalized,
        described=True,
    )


def _plan_undescribed(
    texts: Sequence[str], options: EmbedOptions, model: str, normalized: bool, encoding_name: str
) -> EmbedPlan:
    why = "it declares no embedding options"
    for name in ("prompt_name", "input_type", "truncation_direction", "truncate"):
        value = getattr(options, name)
        if value is not None:
            raise _not_applied(model, name, value, why)
    if options.encoding != "float":
        raise _not_applied(model, encoding_name, options.wire_encoding, why)
    return EmbedPlan(
        items=list(texts),
        options=options,
        truncate=True,
        max_seq_length=None,
        door_dimensions=options.dimensions,
        normalized=normalized,
    )


def check_dimensions(
    dimensions: int | None, width: int | None, normalized: bool, model: str
) -> None:
    if dimensions is None or width is None or dimensions == width:
        return
    if dimensions > width:
        raise OptionError(
            f"dimensions is {dimensions}, but model {model!r} has {width}-dimensional embeddings",
            param="dimensions",
        )
    if not normalized:
        raise OptionError(
            f"model {model!r} does not normalise its embeddings, so they cannot be shortened "
            f"to {dimensions} dimensions; leave dimensions out, or set it to {width}",
            param="dimensions",
            code="dimensions_not_supported",
        )


def truncated_flags(plan: EmbedPlan, lengths: Sequence[int] | None) -> list[bool] | None:
    """Which texts the model will cut, from each one's length before truncation (counted
    with :meth:`EmbedPlan.token_limit`); None when the model's length is not known."""
    limit = plan.max_seq_length
    if limit is None or lengths is None:
        return None
    return [length > limit for length in lengths]


def refused_text(plan: EmbedPlan, flags: Sequence[bool] | None) -> int | None:
    """The first text over the model's length when the request does not allow cutting it."""
    if plan.truncate or not flags or not any(flags):
        return None
    return list(flags).index(True)


def too_long(plan: EmbedPlan, index: int, tokens: int) -> TextTooLong:
    """The 413 of text ``index``, ``tokens`` long, with ``truncate: false``."""
    return TextTooLong(
        f"input {index} has {tokens} tokens, over the model's limit of {plan.max_seq_length} "
        "tokens (prompt and special tokens included); shorten it, or send truncate: true to "
        "have it cut"
    )
