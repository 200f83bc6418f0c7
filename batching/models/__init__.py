"""Models: the contract every model meets (:mod:`.protocol`), where a model comes from
(:mod:`.source`), the items, parameters and media checks the data plane reads, and the model
families beside them (:mod:`.embedding`, :mod:`.text`, :mod:`.generation`, :mod:`.images`,
:mod:`.audio`; what two of them share in :mod:`.shared`), the only modules that import torch.
A family never imports another family.

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
