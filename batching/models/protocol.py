"""The Model contract: the one seam between the server and whatever computes.

A model object is built once per instance, loaded on that instance's device, and then called
only from that instance's dedicated thread (or process), one batch at a time.

Two methods are required (:class:`Model`); eight hooks are optional. :class:`ModelBase`
declares every one of them with its default, and :func:`hooks_of` is the only place the
server looks them up, so a model that subclasses ``ModelBase`` and a plain class that only
has ``load`` and ``predict`` are served alike.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # for annotations only: importing this module imports no numpy
    from numpy.typing import NDArray

    from .items import Item

__all__ = [
    "EXPANDS_KEY",
    "MAX_SEQ_LENGTH_KEY",
    "Model",
    "ModelBase",
    "ModelHooks",
    "hooks_of",
    "load_model",
    "tensors_of",
    "unload_model",
    "warmup_batches",
]

logger = logging.getLogger("batching")


@runtime_checkable
class Model(Protocol):
    """What the server needs of a model.

    ``load(device)`` places the model on ``device`` ("cpu", "cuda:0", ...). A model that
    wants to know which instance it is (to pick a port, a shard, a log name) declares a
    parameter named ``instance_index``: ``load(self, device, instance_index=0)``; the server
    then calls ``load(device, instance_index=i)``, where ``i`` is the instance's position in
    the model's device list (0, 1, ...; stable across restarts). A ``load(device)`` without
    that parameter is called as before; ``**kwargs`` alone does not opt in, since it often
    forwards to a loader that would reject the unknown keyword.

    ``predict(inputs)`` takes a list of inputs and returns exactly one output per input, in
    order. Outputs are JSON-serialisable values or numpy arrays (a 2-D array counts as one row
    per input). An input is one item: a text (or a row of numbers) for a model with one input;
    for a model whose metadata declares several named inputs, a dict of the inputs sent for
    that item, by name (``{"text": a, "text_pair": b}`` for a text-pair classifier).

    A model served by process instances is built in a child process: its class must be
    importable by module name, and its outputs and exceptions picklable.
    """

    def load(self, device: str) -> None: ...

    def predict(self, inputs: list[Any]) -> Sequence[Any] | NDArray[Any]: ...


class ModelBase:
    """A base class for your own model: the two required methods and every optional hook,
    each with its default. Subclass it and override what your model needs.

    The hooks, all called by the server on the instance's thread or at start-up:

    - :meth:`warmup_inputs`: batches to run before the instance reports ready.
    - :meth:`count_tokens`: the padded length of one input, for token-aware batching, and the
      tokens reported as usage by the OpenAI-compatible doors.
    - :meth:`token_length`: how long an input is before truncation, for request limits.
    - :meth:`metadata`: the v2 description of inputs and outputs.
    - :attr:`max_seq_length`: the longest text input, in tokens (what a longer one is cut
      to), for generated warm-up text; the model's metadata states it.
    - :meth:`expand` and :meth:`join`: one request item as several units of batching (a text
      and each of its candidate labels), and its answer assembled from theirs; called by the
      data plane on a worker thread, for every door, and by the warm-up.
    - :meth:`unload`: release what :meth:`load` started, when the instance closes.
    """

    #: The longest text input in tokens; the "random" warm-up writes that many words, and
    #: the model metadata says it. None: not a text model, or no limit known.
    max_seq_length: int | None = None

    def load(self, device: str) -> None:
        """Place the model on ``device`` ("cpu", "cuda:0", ...). Load weights here, not in
        ``__init__``: it runs on the instance's own thread or process."""

    def predict(self, inputs: list[Any]) -> Sequence[Any] | NDArray[Any]:
        """One output per input, in order. Called with a whole batch at a time."""
        raise NotImplementedError

    def warmup_inputs(self, max_batch_size: int) -> list[list[Any]]:
        """Batches to run before the instance reports ready (build them with
        :func:`warmup_batches`). Their items are also the samples a configured warm-up
        (``warmup.batch_sizes``) repeats to each size. Default: none."""
        return []

    def count_tokens(self, item: Any) -> int:
        """The padded length ``item`` costs in a batch, for token-aware batching
        (``--max-batch-tokens``). Default: 1, so batches count items only."""
        return 1

    def token_length(self, item: Any, limit: int) -> int:
        """How many tokens ``item`` has before any truncation, special tokens included,
        counted no further than ``limit`` (a result of ``limit`` means "at least ``limit``"):
        what request limits are checked against (the OpenAI door refuses inputs over 8192
        tokens, even when the model would truncate them). Default: absent, and the limits
        are checked against :meth:`count_tokens`."""
        return self.count_tokens(item)

    def metadata(self) -> dict[str, Any]:
        """v2-style ``inputs``/``outputs`` descriptions (``name``, ``datatype``, ``shape``,
        per item), and optionally ``platform``. The first input's datatype says what the
        model takes: BYTES is text (the default when the model describes nothing); a numeric
        type with a fixed shape lets the "zero" and "random" warm-ups generate inputs.

        Several inputs make every item a dict of them by name; an input described with
        ``"optional": True`` may be left out of a request (and of its items). An input described
        with ``"content": "image"`` (or ``"audio"``) is media: every door hands the model
        its ``bytes`` (a raw body, base64, v2 BYTES; never a path or a URL), and the data
        plane refuses an image that is too large (413) or undecodable (400) before it is
        queued. Inputs described with ``"exclusive": True`` are one per item: each item sets
        exactly one of them (a text or an image). A model whose
        inputs are ``text`` and ``text_pair`` (BYTES) is a text-pair model, served by
        ``/v1/rerank`` too; it may list its ``labels`` (top level, in the order of its
        logits) so that the relevance of a ``{"label", "score"}`` output can be read (see
        :mod:`batching.codecs.rerank`). A text model whose first output is FP32 of shape
        ``[-1, dim]`` is an embedding model, served by ``/v1/embeddings``; that output may
        say ``"normalized": True`` (unit vectors), which lets clients ask for fewer
        ``dimensions``. A text model may name a ``mask_token`` (top level) that every text
        must hold, as fill-mask models do: a text without it is refused (422) before it is
        queued, so it cannot fail the batch it would have joined. Default: nothing
        described."""
        return {}

    def expand(self, item: Any) -> list[Any]:
        """The units of batching one request item is made of (each queued, counted, packed and
        passed to :meth:`predict` like any item), for a model that declares ``"expands": True``
        in its metadata (:data:`EXPANDS_KEY`). Called on a worker thread, on the object that
        counts tokens (never loaded). Raise ``ValueError`` for an item that cannot be
        expanded (a 400 naming why). The warm-up batches of such a model are request items
        too: each is expanded, its units run, and its answer joined, as a request's. Default:
        absent (an item is its own unit)."""
        return [item]

    def join(self, item: Any, outputs: list[Any]) -> Any:
        """The answer to ``item`` from the outputs :meth:`predict` gave its :meth:`expand`
        units, in order. Default: absent."""
        return outputs

    def unload(self) -> None:
        """Release what :meth:`load` started that would outlive the object (background
        threads, device memory, open handles). Called once, on the instance's thread after
        its last batch, when the instance closes: the model is unloaded, its instance
        restarts, its load failed, or the server stops. A process instance's child exits
        instead. Default: absent."""


#: The metadata key by which a model says its items are expanded (:meth:`ModelBase.expand`):
#: the data plane then asks its hooks for every request.
EXPANDS_KEY = "expands"
#: The metadata key stating the model's :attr:`ModelBase.max_seq_length` (the runtime adds
#: it, once the model has loaded, to the metadata of a model that describes itself).
MAX_SEQ_LENGTH_KEY = "max_seq_length"


@dataclass(frozen=True, slots=True)
class ModelHooks:
    """The optional hooks of one model object, each None where the model lacks it."""

    warmup_inputs: Callable[[int], Sequence[Sequence[Item]]] | None
    count_tokens: Callable[[Item], int] | None
    token_length: Callable[[Item, int], int] | None
    metadata: Callable[[], dict[str, Any]] | None
    max_seq_length: int | None
    expand: Callable[[Item], list[Item]] | None = None
    join: Callable[[Item, list[object]], object] | None = None
    unload: Callable[[], None] | None = None


def hooks_of(model: object) -> ModelHooks:
    """The optional hooks ``model`` has: the only place the server looks them up.

    ``ModelBase``'s own defaults count as absent, so that a subclass that does not override
    ``count_tokens`` is batched by items and one that does not describe itself is a text model.
    """
    length = getattr(model, "max_seq_length", None)
    if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
        length = None
    return ModelHooks(
        warmup_inputs=_own(model, "warmup_inputs"),
        count_tokens=_own(model, "count_tokens"),
        token_length=_own(model, "token_length"),
        metadata=_own(model, "metadata"),
        max_seq_length=length,
        expand=_own(model, "expand"),
        join=_own(model, "join"),
        unload=_own(model, "unload"),
    )


def _own(model: object, name: str) -> Any:
    method = getattr(model, name, None)
    if method is None or not callable(method):
        return None
    if getattr(type(model), name, None) is getattr(ModelBase, name):
        return None
    return method


def tensors_of(metadata: Mapping[str, object], kind: str) -> list[Mapping[str, object]]:
    """The tensors a model's metadata describes under ``kind`` (``"inputs"`` or
    ``"outputs"``), in order: each a mapping (``name``, ``datatype``, ``shape``, ...)."""
    listed = metadata.get(kind)
    if not isinstance(listed, list | tuple):
        return []
    return [entry for entry in listed if isinstance(entry, Mapping)]


def load_model(model: Model, device: str, instance_index: int) -> None:
    """Call ``model.load(device)``, adding ``instance_index`` when ``load`` declares it."""
    if _declares(model.load, "instance_index"):
        load: Callable[..., None] = model.load
        load(device, instance_index=instance_index)
    else:
        model.load(device)


def unload_model(model: Model) -> None:
    """Call ``model``'s :meth:`~ModelBase.unload` if it has one; a failure is logged, never
    raised (the instance is going away either way)."""
    unload = hooks_of(model).unload
    if unload is None:
        return
    try:
        unload()
    except Exception as exc:
        logger.warning("unloading %s failed: %r", type(model).__name__, exc)


def _declares(function: Callable[..., object], name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False  # builtins and some C extensions have no introspectable signature
    parameter = parameters.get(name)
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def warmup_batches(sample: Any, max_batch_size: int) -> list[list[Any]]:
    """The default warm-up: one batch of 1 and one of ``max_batch_size``."""
    sizes = sorted({1, max_batch_size})
    return [[sample] * size for size in sizes]
