"""Models loaded, reloaded and unloaded while the server serves (Triton's model repository
extension, and ``--model-control-mode poll``): :mod:`.loads` does it, :mod:`.options` is what
the app is given for it, :mod:`.states` what the index and ``/metrics`` show of it."""

from .control_options import (
    MODES,
    ApplyOverrides,
    ControlOptions,
    MakeDeployment,
    OnFailure,
    OnReady,
    ReadRepository,
    RepositoryEntry,
)
from .loads import ModelControl
from .states import STATES, StateCollector, model_states

__all__ = [
    "MODES",
    "STATES",
    "ApplyOverrides",
    "ControlOptions",
    "MakeDeployment",
    "ModelControl",
    "OnFailure",
    "OnReady",
    "ReadRepository",
    "RepositoryEntry",
    "StateCollector",
    "model_states",
]
