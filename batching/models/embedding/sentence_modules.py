"""What a sentence-transformers folder puts after its Transformer: its ``Pooling`` module
(``1_Pooling/config.json``: the modes, whether prompt tokens are pooled, the width) and whether
a ``Normalize`` module follows (``modules.json``), read once and applied in numpy; and what an
embedding item may ask of the vectors they make.

A folder without ``modules.json`` is pooled with its pooling config (mean if none) and
normalised, since unit vectors are what cosine search expects. A folder with other modules
(Dense, ...) is refused rather than served with silently different vectors. Reads files and
numpy; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batching.errors import UnprocessableInput

from ..items import ENCODINGS, EmbedItem
from ..shared.text_models import read_config, read_json
from .pooling import LEGACY_POOLING_FLAGS, POOLING_MODES, pool

__all__ = ["SentenceModules"]


@dataclass(frozen=True, slots=True)
class SentenceModules:
    """A folder's pooling and normalisation.

    :param modes: the pooling modes, concatenated in this order.
    :param include_prompt: False: prompt tokens are left out of pooling (instruction models
        such as INSTRUCTOR).
    :param normalize: whether vectors are L2-normalised (a ``Normalize`` module).
    :param dimension: the width of a pooled vector; -1 when the folder does not say.
    """

    modes: tuple[str, ...]
    include_prompt: bool
    normalize: bool
    dimension: int

    @classmethod
    def read(cls, folder: Path, config: Mapping[str, object]) -> SentenceModules:
        """The modules of ``folder``, whose ``config.json`` is ``config``.

        :raises ValueError: a module or pooling mode that is not supported, naming it.
        """
        pooling_dir, normalize = _read_modules(folder)
        pooling_path = folder / pooling_dir / "config.json"
        pooling = read_config(pooling_path) if pooling_path.is_file() else {}
        modes = _pooling_modes(folder, pooling)
        width = pooling.get("word_embedding_dimension") or pooling.get("embedding_dimension")
        if not isinstance(width, int):
            width = config.get("hidden_size") or config.get("d_model")
        return cls(
            modes=modes,
            include_prompt=bool(pooling.get("include_prompt", True)),
            normalize=normalize,
            dimension=width * len(modes) if isinstance(width, int) else -1,
        )

    def check(self, item: EmbedItem, model: str) -> None:
        """Whether these vectors can be what ``item`` asks for (``model`` names them).

        :raises UnprocessableInput: an output, encoding or width they cannot be.
        """
        if item.output not in ("dense", "tokens"):
            raise UnprocessableInput(f"{model} returns dense or tokens outputs, not {item.output}")
        if item.output == "tokens" and (item.dimensions is not None or item.encoding != "float"):
            raise UnprocessableInput(
                "per-token vectors are float32 of the model's full width: dimensions and "
                "compact encodings apply to dense vectors only"
            )
        if item.encoding not in ENCODINGS:
            raise UnprocessableInput(
                f"encoding {item.encoding!r} is not one of {', '.join(ENCODINGS)}"
            )
        if item.dimensions is not None and not 0 < item.dimensions <= self.dimension:
            raise UnprocessableInput(
                f"dimensions must be between 1 and {self.dimension}, not {item.dimensions}"
            )

    def vectors(
        self, hidden: np.ndarray, mask: np.ndarray, prompt_lengths: np.ndarray | None
    ) -> np.ndarray:
        """One vector per row of ``hidden`` (``[batch, seq, width]``), pooled over the real
        tokens of ``mask`` (the prompt's left out when the folder says so), then normalised."""
        lengths = None if self.include_prompt else prompt_lengths
        pooled: np.ndarray = pool(hidden, mask, self.modes, lengths)
        if self.normalize:
            # torch.nn.functional.normalize's rule: divide by the norm, at least 1e-12.
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            pooled = pooled / np.maximum(norms, np.float32(1e-12))
        return pooled


def _read_modules(folder: Path) -> tuple[str, bool]:
    """Where the pooling config lives, and whether outputs are normalised."""
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return "1_Pooling", True
    pooling_dir, normalize = "1_Pooling", False
    modules = read_json(modules_path)
    for module in modules if isinstance(modules, list) else ():
        entry: Mapping[str, object] = module if isinstance(module, dict) else {}
        kind = str(entry.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Pooling":
            path = entry.get("path")
            pooling_dir = path if isinstance(path, str) and path else pooling_dir
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise ValueError(
                f"{folder}: module {kind!r} in modules.json is not supported; "
                "only Transformer, Pooling and Normalize are"
            )
    return pooling_dir, normalize


def _pooling_modes(folder: Path, pooling: Mapping[str, object]) -> tuple[str, ...]:
    mode = pooling.get("pooling_mode")
    if isinstance(mode, str):
        modes: tuple[str, ...] = (mode,)
    elif isinstance(mode, list | tuple):
        modes = tuple(mode)
    else:
        modes = tuple(m for key, m in LEGACY_POOLING_FLAGS.items() if pooling.get(key))
    modes = modes or ("mean",)
    unsupported = [m for m in modes if m not in POOLING_MODES]
    if unsupported:
        raise ValueError(
            f"{folder}: pooling {unsupported} is not supported; "
            f"supported: {', '.join(POOLING_MODES)}"
        )
    return modes
