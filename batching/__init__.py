"""Dynamic batching for transformers/torch models served over HTTP."""

from .app import create_app
from .config import BatchingConfig, ModelConfig
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
from .model import DEFAULT_MODEL_NAME, Model

__all__ = [
    "DEFAULT_MODEL_NAME",
    "BatchingConfig",
    "BatchingError",
    "ClientError",
    "DeadlineExceeded",
    "InferenceFailed",
    "InvalidRequest",
    "Model",
    "ModelConfig",
    "ModelNotFound",
    "NotReady",
    "Overloaded",
    "PayloadTooLarge",
    "Unavailable",
    "UnprocessableInput",
    "create_app",
]
