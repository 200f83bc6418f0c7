"""Models: the contract every model meets (:mod:`.protocol`), where a model comes from
(:mod:`.source`), and the transformers-backed models (:mod:`.sentence`, :mod:`.pipeline`),
the only modules that import torch.

Importing this package imports no torch.
"""

from .protocol import Model, ModelBase, hooks_of, load_model, warmup_batches
from .source import DEFAULT_MODEL_NAME, ModelSource, ModelSourceError, load_model_class

__all__ = [
    "DEFAULT_MODEL_NAME",
    "Model",
    "ModelBase",
    "ModelSource",
    "ModelSourceError",
    "hooks_of",
    "load_model",
    "load_model_class",
    "warmup_batches",
]
