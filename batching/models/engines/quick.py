"""A first start that serves at once: the export, and one safe variant checked, then ready.

Timing every variant takes most of a first start (tens of seconds on a small CPU, more on a
busy one). So a server's first start (``EngineOptions.quick_start``) exports the model, checks
the first :data:`SAFE` variant that is a candidate against torch fp32 on the calibration
inputs, and saves a *provisional* decision that routes every batch size to it. The server
serves on it; the full measurement runs afterwards in the background
(:mod:`.retake`, on a quiet machine) and its choice is swapped in between two batches.
A safe variant that fails its check (or none being a candidate) means the full measurement
runs now, as before.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from .accuracy import compare
from .cache import EngineCache, ExportFailed
from .decision import Decision, Measurement, Route, variant_name
from .job import EngineJob
from .measure import grown_mb, resident_mb
from .variants import build_runner, export_folder

__all__ = ["SAFE", "provisional_choice"]

logger = logging.getLogger("batching.engines")

#: The variants served while the others are measured, first candidate first: the export on
#: ONNX Runtime fp32 (the closest to torch fp32, quick to build, no compilation per shape).
SAFE = (("onnxruntime", "fp32"), ("openvino", "fp32"))


def provisional_choice(
    job: EngineJob, cache: EngineCache, variants: list[tuple[str, str]], setup: dict[str, Any]
) -> bool:
    """Save a provisional decision for the first safe variant that passes its check; False
    (nothing saved) when none is a candidate, the export fails or the check does."""
    safe = next((variant for variant in SAFE if variant in variants), None)
    if safe is None or job.measure is None:
        return False
    name = job.options.model_name
    try:
        export_folder(job, cache)
    except ExportFailed:
        return False
    engine, precision = safe
    before = resident_mb()
    reference = job.load_reference()
    from . import torch_engine

    reference_runner = torch_engine.TorchRunner(reference, "fp32")
    calibration = list(job.calibration())
    expected = np.concatenate([job.view(reference_runner(batch), batch) for batch in calibration])
    try:
        runner = build_runner(job, cache, engine, precision, reference)
        outputs = np.concatenate([job.view(runner(batch), batch) for batch in calibration])
    except Exception as exc:
        logger.info("model %s: %s cannot serve (%s)", name, variant_name(*safe), exc)
        return False
    accuracy = compare(job.measure, expected, outputs)
    if not accuracy.ok:
        return False
    sizes = sorted(set(job.options.batch_sizes))
    measurement = Measurement(
        engine,
        precision,
        accuracy=accuracy.figure,
        accuracy_text=accuracy.text,
        memory_mb=grown_mb(before),
    )
    decision = Decision(
        (Route(engine, precision, 1, max(sizes)),),
        "served at once while the variants are measured in the background",
        (measurement,),
        provisional=True,
    )
    notes: dict[str, Any] = {"measured_at": time.time()}
    if job.check_tokenizer is not None:
        notes["tokenizer_json_differs"] = job.check_tokenizer()
    cache.save_decision(setup, {"decision": decision.to_json(), **notes})
    logger.info(
        "model %s: %s %s against torch fp32: served at once; the variants are measured once "
        "the server is ready",
        name,
        variant_name(*safe),
        accuracy.text,
    )
    return True
