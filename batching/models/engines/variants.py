"""The variants of an engine choice: the (engine, precision) pairs the options allow
(:func:`candidates`), and each one's runner (:func:`build_runner`), built from the model's ONNX
export (made once, into the cache) for the engines other than torch."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from .cache import FUSED, PLAIN, EngineCache
from .engine_options import EngineOptions, installed, thread_budget
from .job import EngineJob
from .plan import Runner
from .shared import shared_runner

__all__ = ["build_runner", "candidates", "export_folder", "max_tokens"]

logger = logging.getLogger("batching.engines")


def candidates(options: EngineOptions, *, gpu: bool, measurable: bool) -> list[tuple[str, str]]:
    """The (engine, precision) variants the options allow, torch fp32 first when it is one.

    Pure: which engines are installed is asked of :func:`installed`.
    """
    if not measurable:
        return [("torch", "fp32")]
    engines = ["torch"] if gpu else ["torch", "onnxruntime", "openvino"]
    if options.engine != "auto":
        engines = [options.engine]
    else:
        engines = [engine for engine in engines if installed(engine)]
    precisions = {
        "torch": ["fp32", "bf16", "fp16"] if gpu else ["fp32", "bf16"],
        "onnxruntime": ["fp32"],
        "openvino": ["fp32", "bf16"],
    }
    found = [
        (engine, precision)
        for engine in engines
        for precision in precisions[engine]
        if options.precision in ("auto", precision)
    ]
    # fp16 only when asked: on a GPU auto weighs bf16 against fp32, as on a CPU.
    if options.precision == "auto":
        found = [variant for variant in found if variant[1] != "fp16"]
    return found


def build_runner(
    job: EngineJob,
    cache: EngineCache,
    engine: str,
    precision: str,
    reference: Any,
    *,
    threads: int | None = None,
) -> Runner:
    """One variant's runner; ``reference`` is the loaded fp32 torch model, if it is (a
    measurement's runners are its own; the others are shared with copies of the model in this
    process: :mod:`.shared`)."""
    count = threads or thread_budget()

    def build() -> Runner:
        if engine == "torch":
            from . import torch_engine

            return torch_engine.TorchRunner(
                reference if reference is not None else job.load_reference(), precision
            )
        folder = export_folder(job, cache)
        if engine == "onnxruntime":
            from .ort_engine import OnnxRuntimeRunner

            fused = folder / FUSED
            return OnnxRuntimeRunner(fused if fused.is_file() else folder / PLAIN, count)
        if engine == "openvino":
            from .openvino_engine import OpenVinoRunner

            # A measurement's variants compile through a blob cache (one per precision and
            # thread count: OpenVINO 2026.4 crashed, double free, compiling bf16 from a folder
            # that held the f32 blob of the same graph); a serving runner reads the graph
            # once, so its other thread counts share the weights.
            # The serving runner reads the IR, whose weights are mapped (:mod:`.mapped_weights`).
            if reference is not None:
                blobs = cache.folder / "openvino" / f"{precision}-{count}threads"
                return OpenVinoRunner(
                    folder / PLAIN, precision, count, blobs, max_tokens(job.folder)
                )
            from .mapped_weights import openvino_ir

            graph = openvino_ir(folder / PLAIN)
            return OpenVinoRunner(graph, precision, count, None, max_tokens(job.folder))
        raise ValueError(f"unknown engine {engine!r}")

    if reference is None:
        return shared_runner((str(cache.folder), engine, precision, count, job.device), build)
    return build()


def max_tokens(folder: Path) -> int | None:
    """The longest input an engine may pad to: the largest power of two within the model's
    position table (``max_position_embeddings``: 512 for BERT, 514 for RoBERTa), or None."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        positions = int(config["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return 1 << (positions.bit_length() - 1) if positions > 0 else None


def export_folder(job: EngineJob, cache: EngineCache) -> Path:
    """The folder of the model's ONNX export, made first if the cache has none."""

    def make(out: Path) -> None:
        from . import export  # torch and transformers: only when exporting

        logger.info(
            "model %s: exporting %s to ONNX into %s",
            job.options.model_name,
            job.folder,
            cache.folder,
        )
        export.export_onnx(job.folder, job.head, job.names(), out)

    folder, _ = cache.export(make)
    return folder
