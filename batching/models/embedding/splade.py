"""What a SPLADE folder says about its sparse vectors, read without torch: the layout
:class:`~batching.models.embedding.sparse.SparseEmbedder` reproduces, checked at start-up.

Two kinds of folder serve sparse vectors:

- a sentence-transformers ``SparseEncoder`` folder: ``modules.json`` lists a masked-LM
  transformer (``MLMTransformer``, or ``Transformer`` with ``transformer_task: fill-mask``)
  followed by ``SpladePooling``. Any other module (``SparseStaticEmbedding`` of the
  inference-free models, ``Router``/``Asym``, ``SparseAutoEncoder``, ``Dense``, ...) would
  change the vectors, so such a folder is refused rather than served differently;
- any masked-LM folder with ``--task sparse-embedding``: max pooling of ``log1p(relu(logits))``
  over the real tokens, sentence-transformers' defaults for ``MLMTransformer`` +
  ``SpladePooling``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

__all__ = [
    "SPARSE_TASK",
    "SpladeLayout",
    "is_sparse_folder",
    "read_layout",
]

#: The ``--task`` that serves a masked-LM folder as SPLADE sparse embeddings.
SPARSE_TASK = "sparse-embedding"

_POOLING_STRATEGIES = ("max", "sum")
_ACTIVATIONS = ("relu", "log1p_relu")
#: Modules that mark a folder as a SparseEncoder's (served here or refused, never dense).
_SPARSE_MODULES = frozenset(
    {"SpladePooling", "MLMTransformer", "SparseStaticEmbedding", "SparseAutoEncoder"}
)
_TRANSFORMERS = ("MLMTransformer", "Transformer")


@dataclass(frozen=True, slots=True)
class SpladeLayout:
    """How a folder's sparse vectors are computed.

    :param transformer: the folder holding the masked-LM weights and tokenizer.
    :param pooling: ``max`` (SPLADE v2 and later) or ``sum`` over the tokens.
    :param activation: ``relu`` (``log1p(relu(x))``) or ``log1p_relu`` (a second log1p).
    :param max_seq_length: tokens, special tokens included; None: the tokenizer's and the
        position table's limit.
    :param lowercase: lower-case texts before tokenising (``do_lower_case``).
    :param prompts: prompt name -> text, from ``config_sentence_transformers.json``.
    :param default_prompt_name: the folder's default prompt, if any.
    :param max_active_dims: keep only the largest this many values of each vector.
    """

    transformer: Path
    pooling: str = "max"
    activation: str = "relu"
    max_seq_length: int | None = None
    lowercase: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    max_active_dims: int | None = None

    @property
    def default_prompt(self) -> str:
        if self.default_prompt_name is None:
            return ""
        return self.prompts.get(self.default_prompt_name, "")


def _read(path: Path) -> object:
    try:
        with path.open(encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path.parent.name}/{path.name} cannot be read as JSON: {exc}") from None


def _kind(module: object) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1] if isinstance(module, dict) else ""


def is_sparse_folder(folder: Path) -> bool:
    """Whether a sentence-transformers folder is a SparseEncoder's (its ``modules.json``
    names a sparse module, or its config says ``model_type: SparseEncoder``)."""
    modules_path = folder / "modules.json"
    st_config = folder / "config_sentence_transformers.json"
    try:
        modules = _read(modules_path) if modules_path.is_file() else None
        if isinstance(modules, list) and any(_kind(m) in _SPARSE_MODULES for m in modules):
            return True
        document = _read(st_config) if st_config.is_file() else None
    except ValueError:
        return False
    return isinstance(document, dict) and document.get("model_type") == "SparseEncoder"


def read_layout(folder: Path) -> SpladeLayout:
    """The layout of ``folder``: its SparseEncoder modules, or (with ``--task
    sparse-embedding`` on a folder without them) SPLADE's defaults over its masked LM.

    :raises ValueError: a folder that is not a masked LM, or a SparseEncoder whose modules
        are not exactly a masked-LM transformer and ``SpladePooling`` (message for the
        command line).
    """
    modules_path = folder / "modules.json"
    has_modules = modules_path.is_file() and is_sparse_folder(folder)
    if not has_modules:
        _require_masked_lm(folder)
        layout = SpladeLayout(transformer=folder)
    else:
        layout = _from_modules(folder, _read(modules_path))
    return _with_prompts(folder, layout)


def _require_masked_lm(folder: Path) -> None:
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"model folder {folder} has no config.json: point --model at the folder that "
            "holds the masked language model's config.json and weights"
        )
    config = _read(folder / "config.json")
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if isinstance(architectures, list) and architectures:
        if not any(str(name).endswith("ForMaskedLM") for name in architectures):
            raise ValueError(
                f"{folder.name} holds {', '.join(map(str, architectures))}, not a masked "
                f"language model: --task {SPARSE_TASK} needs a *ForMaskedLM model (SPLADE "
                "pools its vocabulary logits)"
            )


def _from_modules(folder: Path, modules: object) -> SpladeLayout:
    if not isinstance(modules, list):
        raise ValueError(f"{folder.name}/modules.json is not a list of modules")
    kinds = [_kind(module) for module in modules]
    if len(kinds) != 2 or kinds[0] not in _TRANSFORMERS or kinds[1] != "SpladePooling":
        raise ValueError(
            f"{folder.name} is a SparseEncoder made of {' + '.join(kinds) or 'no modules'}; "
            "only a masked-LM transformer followed by SpladePooling is served (not "
            "SparseStaticEmbedding, Router, SparseAutoEncoder or other modules)"
        )
    transformer_dir = str(modules[0].get("path") or "")
    transformer = folder / transformer_dir if transformer_dir else folder
    _require_masked_lm(transformer)
    st_path = transformer / "sentence_bert_config.json"
    st_config = _read(st_path) if st_path.is_file() else {}
    if not isinstance(st_config, dict):
        st_config = {}
    task = st_config.get("transformer_task", "fill-mask")
    if task != "fill-mask":
        raise ValueError(
            f"{folder.name}: its transformer runs {task!r}; SpladePooling needs 'fill-mask'"
        )
    if st_config.get("processing_kwargs"):
        raise ValueError(
            f"{folder.name}: processing_kwargs in sentence_bert_config.json are not supported"
        )
    pooling_dir = str(modules[1].get("path") or "")
    pooling_path = folder / pooling_dir / "config.json"
    pooling = _read(pooling_path) if pooling_dir and pooling_path.is_file() else {}
    if not isinstance(pooling, dict):
        pooling = {}
    strategy = pooling.get("pooling_strategy", "max")
    activation = pooling.get("activation_function", "relu")
    if strategy not in _POOLING_STRATEGIES or activation not in _ACTIVATIONS:
        raise ValueError(
            f"{folder.name}: SpladePooling {strategy!r}/{activation!r} is not supported; "
            f"pooling {' or '.join(_POOLING_STRATEGIES)}, activation {' or '.join(_ACTIVATIONS)}"
        )
    length = st_config.get("max_seq_length")
    return SpladeLayout(
        transformer=transformer,
        pooling=str(strategy),
        activation=str(activation),
        max_seq_length=length if isinstance(length, int) and length > 0 else None,
        lowercase=bool(st_config.get("do_lower_case", False)),
    )


def _with_prompts(folder: Path, layout: SpladeLayout) -> SpladeLayout:
    path = folder / "config_sentence_transformers.json"
    if not path.is_file():
        return layout
    document = _read(path)
    if not isinstance(document, dict):
        return layout
    raw = document.get("prompts") or {}
    prompts = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    default = document.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(
            f"{folder.name}: default_prompt_name {default!r} is not one of its prompts"
        )
    active = document.get("max_active_dims")
    if active is not None and (isinstance(active, bool) or not isinstance(active, int)):
        raise ValueError(f"{folder.name}: max_active_dims must be a positive integer")
    if isinstance(active, int) and active <= 0:
        raise ValueError(f"{folder.name}: max_active_dims must be a positive integer")
    return replace(
        layout,
        prompts=prompts,
        default_prompt_name=str(default) if default is not None else None,
        max_active_dims=active,
    )
