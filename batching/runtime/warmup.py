"""Loading an instance and warming it up: the batches it runs before it reports ready."""

from __future__ import annotations

import gc
import json
import random
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import cycle, islice

import psutil

from batching.model_config import ModelConfig
from batching.models.items import Item
from batching.models.parameters import (
    InvalidParameter,
    Parameters,
    TaskItem,
    check_parameters,
    declared_parameters,
)
from batching.models.protocol import (
    EXPANDS_KEY,
    MAX_SEQ_LENGTH_KEY,
    Model,
    hooks_of,
    load_model,
)

from .allocator import trim

__all__ = [
    "InstanceInfo",
    "Loaded",
    "WarmupPlan",
    "load_and_warm",
    "platform_of",
    "resident_bytes",
    "warmup_inputs_for",
]

#: Words in a generated text when the model does not say how long its inputs may be.
DEFAULT_WARMUP_WORDS = 128

_NUMERIC_TYPES = frozenset(
    {"FP16", "BF16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64"}
    | {"UINT8", "UINT16", "UINT32", "UINT64"}
)


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """What an instance learned while loading."""

    load_s: float
    warmup_s: float
    warmup_batches: int
    metadata: dict[str, object]
    #: What runs the model, as the v2 metadata's ``platform`` says (:func:`platform_of`).
    platform: str = "python"
    #: Resident memory the load and warm-up added (bytes; 0 where it cannot be read). Loads
    #: are one at a time (:data:`~batching.models.loading.LOADING`), so what grew is this
    #: model's: its weights, engines and buffers (less what it shares with a copy loaded
    #: before it, :mod:`batching.models.engines.shared`).
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Loaded:
    """Told while an instance starts: its model is loaded, and its warm-up comes next."""

    load_s: float
    warmup_batches: int


def platform_of(model: object, metadata: dict[str, object]) -> str:
    """The v2 ``platform`` of ``model``: what its metadata says, else ``pytorch`` for the
    transformers-backed models of :mod:`batching.models`, else ``python`` (your own class)."""
    declared = metadata.get("platform")
    if isinstance(declared, str) and declared:
        return declared
    return "pytorch" if type(model).__module__.startswith("batching.models.") else "python"


@dataclass(frozen=True, slots=True)
class WarmupPlan:
    """What an instance runs before it reports ready (``ModelConfig``'s warm-up fields).

    :param batch_sizes: one batch of each size; empty means the model's own plan for
        ``data="model"``, else 1 and ``max_batch_size``.
    :param data: "model" (the samples of the model's ``warmup_inputs``), "zero", "random" or
        "file".
    :param file: with ``data="file"``, a UTF-8 file holding one input per line.
    :param required: the model must run at least one warm-up batch before it reports ready:
        a task's model proves it can serve with inputs of its own kind, and one that makes
        none never reports ready.
    :param parameters: the server-wide task parameters (the model repository's): one more
        batch runs a sample with them, so defaults the model cannot apply stop the start.
    """

    batch_sizes: tuple[int, ...] = ()
    data: str = "model"
    file: str | None = None
    required: bool = False
    parameters: Parameters = ()

    @classmethod
    def of(cls, config: ModelConfig) -> WarmupPlan:
        return cls(
            config.warmup_batch_sizes,
            config.warmup_data,
            config.warmup_file,
            required=config.model_source.kind == "pipeline",
            parameters=config.parameters,
        )


def warmup_inputs_for(
    model: Model, plan: WarmupPlan, max_batch_size: int, seed: int = 0
) -> list[list[Item]]:
    """The warm-up batches ``plan`` asks of a loaded ``model``.

    With ``data="model"`` the items come from the model's ``warmup_inputs`` (none when it has
    no such method). Otherwise the model's metadata decides their type: a BYTES input (or no
    metadata) gets texts, a numeric input with a fixed per-item shape gets nested lists.

    - "zero": empty texts, or zeros;
    - "random": texts of random words as long as the model's ``max_seq_length`` (else
      :data:`DEFAULT_WARMUP_WORDS` words), or uniform numbers; seeded, so reproducible;
    - "file": the file's lines (texts as they are, anything else parsed as JSON), repeated
      to fill each batch.

    :raises RuntimeError: when the data cannot be made for this model (named in the message).
    """
    sizes = list(plan.batch_sizes) or sorted({1, max_batch_size})
    if plan.data == "model":
        own = hooks_of(model).warmup_inputs
        if own is None:
            return []
        batches = [list(batch) for batch in own(max_batch_size)]
        if not plan.batch_sizes:
            return batches
        samples = [item for batch in batches for item in batch]
        return [_fill(samples, size) for size in sizes] if samples else []
    datatype, item_shape = _input_spec(model)
    text = datatype == "BYTES"
    if plan.data == "file":
        assert plan.file is not None
        samples = _read_samples(plan.file, text)
        return [_fill(samples, size) for size in sizes]
    if not text and (datatype not in _NUMERIC_TYPES and datatype != "BOOL"):
        raise RuntimeError(f"warm-up data {plan.data!r} cannot make {datatype} inputs")
    dims = tuple(dim for dim in item_shape if isinstance(dim, int) and dim >= 0)
    if not text and len(dims) != len(item_shape):
        raise RuntimeError(
            f"warm-up data {plan.data!r} needs a fixed input shape, and the model's metadata "
            f"says {[-1, *item_shape]}; use data from a file instead"
        )
    rng = random.Random(seed) if plan.data == "random" else None
    words = _text_length(model) if text else 0
    return [[_generated(rng, words, datatype, dims) for _ in range(size)] for size in sizes]


def _generated(
    rng: random.Random | None, words: int, datatype: str, shape: tuple[int, ...]
) -> Item:
    """One generated input: zero-like without ``rng``, random with it."""
    if datatype == "BYTES":
        return " ".join(_random_word(rng) for _ in range(words)) if rng else ""
    return _tensor(shape, datatype, rng)


def _fill(samples: list[Item], size: int) -> list[Item]:
    return list(islice(cycle(samples), size))


def _input_spec(model: Model) -> tuple[str, tuple[object, ...]]:
    """The first input's datatype and per-item shape (the metadata shape minus the batch
    dimension); a model without metadata is taken to be a text model."""
    describe = hooks_of(model).metadata
    inputs = (describe() or {}).get("inputs") if describe is not None else None
    if not inputs:
        return "BYTES", ()
    first = inputs[0]
    shape = list(first.get("shape") or [-1])
    return str(first.get("datatype", "BYTES")), tuple(shape[1:])


def _text_length(model: Model) -> int:
    # Every word is at least one token, so this many words reach the longest input.
    return hooks_of(model).max_seq_length or DEFAULT_WARMUP_WORDS


def _random_word(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))


def _tensor(shape: tuple[int, ...], datatype: str, rng: random.Random | None) -> Item:
    if shape:
        return [_tensor(shape[1:], datatype, rng) for _ in range(shape[0])]
    if datatype == "BOOL":
        return rng.random() < 0.5 if rng else False
    if datatype.startswith(("INT", "UINT")):
        return rng.randint(0, 100) if rng else 0
    return rng.random() if rng else 0.0


def _read_samples(path: str, text: bool) -> list[Item]:
    samples: list[Item] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if text:
                samples.append(line)
                continue
            try:
                samples.append(json.loads(line))
            except ValueError as exc:
                raise RuntimeError(f"warm-up file {path}, line {number}: not JSON: {exc}") from exc
    if not samples:
        raise RuntimeError(f"warm-up file {path} holds no inputs")
    return samples


def _check_defaults(model: Model, parameters: Parameters) -> None:
    """The configured parameters against what the loaded model declares, with its own
    numbers (a ``max_new_tokens`` over its positions): checked once here, so that a default
    it cannot take stops the start instead of failing every request that relies on it.

    :raises RuntimeError: a default the model does not take; the message names it.
    """
    describe = hooks_of(model).metadata
    if not parameters or describe is None:
        return
    declared = declared_parameters(describe())
    if not declared:
        return
    try:
        check_parameters(declared, {}, dict(parameters))
    except InvalidParameter as exc:
        raise RuntimeError(f"the configured parameters do not fit this model: {exc}") from None


def load_and_warm(
    model: Model,
    device: str,
    max_batch_size: int,
    *,
    index: int = 0,
    warmup: WarmupPlan | None = None,
    on_loaded: Callable[[Loaded], None] | None = None,
) -> InstanceInfo:
    """Load ``model`` on ``device`` and run its warm-up batches; on the instance's thread
    (or in its process).

    :param index: the instance's position in its model's device list, passed to a ``load``
        that declares ``instance_index``.
    :param warmup: which batches to run; the model's own samples by default.
    :param on_loaded: told once the model is loaded, before the warm-up starts (progress for
        the start-up log: loading and warming a real model takes seconds each).
    :raises RuntimeError: when a warm-up batch fails (the instance must not report ready);
        the message names the batch, its size and the data it was made of.
    """
    plan = warmup or WarmupPlan()
    started = time.perf_counter()
    resident = resident_bytes()
    load_model(model, device, index)
    # Loading may have built and dropped much (an engine choice measures several variants
    # and keeps one): free it now and hand the heap's free pages back to the kernel.
    gc.collect()
    trim()
    loaded = time.perf_counter()
    _check_defaults(model, plan.parameters)
    try:
        batches = warmup_inputs_for(model, plan, max_batch_size, seed=index)
    except RuntimeError:  # already says what failed
        raise
    except Exception as exc:
        raise RuntimeError(f"making the warm-up inputs ({plan.data} data) failed: {exc!r}") from exc
    if plan.required and not batches:
        raise RuntimeError(
            f"the model made no warm-up batch ({plan.data} data): a task's model must serve "
            "inputs of its own kind before it reports ready"
        )
    if plan.parameters and batches and batches[0]:
        sample = batches[0][0]
        sample = sample.input if isinstance(sample, TaskItem) else sample
        batches.append([TaskItem(sample, plan.parameters)])
    expansion = _expansion(model)
    if expansion is not None and plan.data != "model" and plan.parameters:
        # Generated or read items are request items: they take the server-wide parameters.
        batches = [[_with(item, plan.parameters) for item in batch] for batch in batches]
    if on_loaded is not None:
        on_loaded(Loaded(loaded - started, len(batches)))
    for number, batch in enumerate(batches, 1):
        where = f"warm-up batch {number} of {len(batches)} (size {len(batch)}, {plan.data} data)"
        try:
            if expansion is None:
                outputs = model.predict(batch)
            else:
                outputs = _expanded_predict(model, expansion, batch)
        except Exception as exc:
            raise RuntimeError(f"{where} failed: {exc!r}") from exc
        if len(outputs) != len(batch):
            raise RuntimeError(f"{where} returned {len(outputs)} outputs")
    warmed = time.perf_counter()
    hooks = hooks_of(model)
    metadata: dict[str, object] = {}
    if hooks.metadata is not None:
        metadata = dict(hooks.metadata())
        if hooks.max_seq_length is not None:
            # What a longer text is cut to, as the model's own attribute says it.
            metadata.setdefault(MAX_SEQ_LENGTH_KEY, hooks.max_seq_length)
    grown = resident_bytes() - resident if resident else 0
    return InstanceInfo(
        loaded - started,
        warmed - loaded,
        len(batches),
        metadata,
        platform_of(model, metadata),
        memory_bytes=max(0, grown),
    )


def resident_bytes() -> int:
    """This process's resident memory in bytes (0 where it cannot be read)."""
    try:
        return int(psutil.Process().memory_info().rss)
    except (psutil.Error, OSError):
        return 0


_Expand = tuple[Callable[[Item], list[Item]], Callable[[Item, list[object]], object]]


def _expansion(model: Model) -> _Expand | None:
    """The ``expand`` and ``join`` hooks of a model that expands its items (as the data plane
    applies them, :mod:`batching.expansion`), or None."""
    hooks = hooks_of(model)
    if hooks.expand is None or hooks.join is None or hooks.metadata is None:
        return None
    if not hooks.metadata().get(EXPANDS_KEY):
        return None
    return hooks.expand, hooks.join


def _with(item: Item, parameters: Parameters) -> Item:
    return item if isinstance(item, TaskItem) else TaskItem(item, parameters)


def _expanded_predict(model: Model, expansion: _Expand, batch: list[Item]) -> list[object]:
    """A warm-up batch of request items, as a request runs them: each expanded into its
    units, the units run as one batch, each item's answer joined from its units' outputs."""
    expand, join = expansion
    groups = [expand(item) for item in batch]
    units = [unit for group in groups for unit in group]
    outputs = model.predict(units)
    if len(outputs) != len(units):
        raise RuntimeError(f"{len(units)} units of batching gave {len(outputs)} outputs")
    answers, start = [], 0
    for item, group in zip(batch, groups, strict=True):
        answers.append(join(item, list(outputs[start : start + len(group)])))
        start += len(group)
    return answers
