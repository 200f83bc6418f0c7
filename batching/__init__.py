"""Dynamic batching for transformers/torch models served over HTTP.

The public names are importable from here. :func:`create_app` (and with it the web stack) is
imported on first use, so ``import batching.core`` does not load Starlette.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core.batching_config import BatchingConfig
from .errors import (
    BatchingError,
    ClientError,
    DeadlineExceeded,
    InferenceFailed,
    InvalidRequest,
    ModelNotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    Unavailable,
    UnprocessableInput,
)
from .model_config import ModelConfig
from .models import DEFAULT_MODEL_NAME, Model, ModelBase, ModelSource

if TYPE_CHECKING:
    from .app import create_app

__all__ = [
    "DEFAULT_MODEL_NAME",
    "BatchingConfig",
    "BatchingError",
    "ClientError",
    "DeadlineExceeded",
    "InferenceFailed",
    "InvalidRequest",
    "Model",
    "ModelBase",
    "ModelConfig",
    "ModelNotFound",
    "ModelSource",
    "NotReady",
    "Overloaded",
    "PayloadTooLarge",
    "Unavailable",
    "UnprocessableInput",
    "create_app",
]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
