"""``python server.py --prepare`` (``batching-server prepare``): fill the engine cache and exit.

For every model of the configuration whose engine is measured (``--engine auto``,
``onnxruntime``, ``openvino``), build the model and load it as an instance would: the export,
the accuracy check and the timing run (in a child process that exits, for the sentence
embedders) and are kept in the engine cache, with the calibration vectors; the load then reads
them back, which proves the cache serves. A container image built with it, or an init
container that runs it on the node into a shared volume (``--engine-cache``), starts its
servers from the cache in seconds. Models that run their own code or torch alone have nothing
to cache and are skipped, with a line saying so.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from collections.abc import Sequence

from batching.model_config import ModelConfig
from batching.models.engines.decision_table import decision_table
from batching.models.protocol import load_model

__all__ = ["prepare_models"]

logger = logging.getLogger("batching")


def prepare_models(models: Sequence[ModelConfig]) -> list[str]:
    """Prepare each model's engine cache; the failures, one line each (empty: all done)."""
    failures: list[str] = []
    for config in models:
        source = config.model_source
        if source.kind == "class" or config.engine == "torch":
            why = "runs its own code" if source.kind == "class" else "runs on torch"
            logger.info("prepare: model %s %s: nothing to cache", config.name, why)
            continue
        # Every variant measured now (not a safe one served while they are measured).
        options = dataclasses.replace(config.engine_options, quick_start=False)
        for device in dict.fromkeys(config.devices):
            started = time.perf_counter()
            logger.info(
                "prepare: model %s (%s) on %s: exporting, checking and timing into %s",
                config.name,
                source.describe(),
                device,
                options.cache_path,
            )
            try:
                model = source.build(options, config.prompt_options)
                load_model(model, device, 0)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                failures.append(f"model {config.name!r} cannot be prepared: {reason}")
                continue
            described = model.metadata() if hasattr(model, "metadata") else {}
            engine: dict[str, object] = described.get("engine") or {}
            logger.info(
                "prepare: model %s on %s ready in %.1f s: %s%s",
                config.name,
                device,
                time.perf_counter() - started,
                engine.get("reason", "cached"),
                "; measured while the machine was busy: the server measures again once idle"
                if engine.get("busy")
                else "",
            )
            if engine.get("measurements"):
                print("\n".join(decision_table(engine)), flush=True)
            del model
            gc.collect()
    return failures
