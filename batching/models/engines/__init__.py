"""Engines: what computes a transformers model's forward, and at which precision.

Torch (fp32, or bf16 weights; fp16 on a GPU), ONNX Runtime (fp32, fused where its optimiser
knows the model type) and OpenVINO (fp32, or its bf16 inference precision) run the same
exported model; ``auto`` checks each against torch fp32 on a calibration set and keeps the
fastest at the batch sizes the server runs. The batching core never sees any of it: a model
runs its plan inside ``load`` and ``predict``.

- :mod:`.options`   what a model is asked to run on, checked at start-up (pure)
- :mod:`.decision`  the choice, from measurements (pure: tests inject the figures)
- :mod:`.plan`      the chosen runner(s), picked per batch by its size
- :mod:`.selection` export, check, time, decide, during the instance's load
- :mod:`.cache`     exports and measurements on disk, keyed by the model's files
- :mod:`.export`    the model to ONNX; :mod:`.accuracy` the check; :mod:`.measure` timing
- :mod:`.torch_engine`, :mod:`.ort_engine`, :mod:`.openvino_engine`: one runner per runtime
- :mod:`.logits`    a transformers pipeline whose logits come from the plan

Importing this package imports no ML library.
"""

from .decision import Decision, Measurement, Route, decide
from .engine_options import (
    ENGINES,
    PRECISIONS,
    EngineConfigError,
    EngineOptions,
    check_engine_settings,
    default_cache_dir,
    installed,
)

__all__ = [
    "ENGINES",
    "PRECISIONS",
    "Decision",
    "EngineConfigError",
    "EngineOptions",
    "Measurement",
    "Route",
    "check_engine_settings",
    "decide",
    "default_cache_dir",
    "installed",
]
