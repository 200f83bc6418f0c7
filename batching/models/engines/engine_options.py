"""What a model is asked to run on: the engine and precision settings, checked at start-up.

Pure: this module imports no ML library, so settings can be validated (and a missing engine
named, with how to install it) before anything heavy loads.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ADAPTIVE_THREADS_VARIABLE",
    "ENGINES",
    "ENGINE_TASKS",
    "PRECISIONS",
    "EngineConfigError",
    "EngineOptions",
    "check_engine_settings",
    "default_cache_dir",
    "installed",
    "thread_budget",
]

#: ``--engine`` values: ``auto`` measures the installed engines and keeps the fastest.
ENGINES = ("auto", "torch", "onnxruntime", "openvino")
#: ``--precision`` values: ``auto`` measures fp32 and bf16 and keeps bf16 only where it is
#: faster and as accurate; fp16 runs on a GPU only.
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
#: The pipeline tasks whose models can run on another engine than torch (the sentence
#: embedder counts as feature-extraction).
ENGINE_TASKS = ("feature-extraction", "text-classification", "fill-mask", "sparse-embedding")

#: transformers' other names for those tasks.
_ALIASES = {"sentiment-analysis": "text-classification"}

#: The Python modules each engine needs, and how to install them.
_MODULES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "onnxruntime": ("onnxruntime", "onnx"),
    "openvino": ("openvino", "onnx"),
}
_INSTALL: dict[str, str] = {
    "onnxruntime": "pip install onnxruntime onnx",
    "openvino": "pip install openvino onnx",
}

#: "0" runs every batch on the whole thread budget (server.py sets it when the count was fixed
#: with --torch-threads N); anything else lets the thread governor adapt the count per batch.
ADAPTIVE_THREADS_VARIABLE = "BATCHING_ADAPTIVE_THREADS"

#: The environment variable that moves the engine cache (``--engine-cache``'s twin).
CACHE_VARIABLE = "BATCHING_ENGINE_CACHE"


class EngineConfigError(ValueError):
    """An engine or precision that cannot be served here; the message says what to do."""


def installed(engine: str) -> bool:
    """Whether ``engine``'s modules can be imported (found, not imported: cheap)."""
    return all(importlib.util.find_spec(module) is not None for module in _MODULES[engine])


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where exported engines are kept: ``$BATCHING_ENGINE_CACHE``, else
    ``$XDG_CACHE_HOME/batching/engines``, else ``~/.cache/batching/engines``."""
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_VARIABLE):
        return Path(environ[CACHE_VARIABLE]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "batching" / "engines"


def thread_budget(environ: Mapping[str, str] | None = None) -> int:
    """The threads each engine runs a batch on: ``OMP_NUM_THREADS`` (which server.py sets from
    the CPU budget, and torch reads), else the CPUs this process may run on. Read without
    importing torch, so that a server whose engine is not torch never loads it."""
    environ = os.environ if environ is None else environ
    try:
        count = int(environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        count = 0
    if count >= 1:
        return count
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """What one model asks of its engine: picklable, handed to the model at build time.

    :param engine: one of :data:`ENGINES`.
    :param precision: one of :data:`PRECISIONS`.
    :param cache_dir: where exports and measurements are kept; None: :func:`default_cache_dir`.
    :param batch_sizes: the batch sizes the server will run, measured by ``auto`` (1 and the
        batch cap).
    :param model_name: the served name, for log lines.
    :param apart: export, check and time in a child process that exits (so that this process
        imports torch only if torch computes), and retake measurements taken on a busy
        machine once the server is idle: what the server does; False measures in-process.
    :param quick_start: with ``apart``, a start that finds nothing in the cache serves a safe
        variant at once and measures the others in the background (:mod:`.quick`); False
        (``--prepare``) measures them before the load ends.
    """

    engine: str = "auto"
    precision: str = "auto"
    cache_dir: str | None = None
    batch_sizes: tuple[int, ...] = (1, 32)
    model_name: str = "model"
    apart: bool = False
    quick_start: bool = True

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()


def check_engine_settings(
    engine: str, precision: str, *, task: str | None, custom: bool, devices: Sequence[str]
) -> None:
    """Refuse, with one line saying what to do, an engine or precision that cannot run.

    :param task: the pipeline task (None: the sentence embedder, or a custom class).
    :param custom: the model is the user's own class, which runs its own code.
    :raises EngineConfigError: for an unknown value, a missing engine, fp16 on a CPU, an
        engine other than torch on a GPU or for a task it does not serve.
    """
    if engine not in ENGINES:
        raise EngineConfigError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if precision not in PRECISIONS:
        raise EngineConfigError(
            f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}"
        )
    task = _ALIASES.get(task, task) if task is not None else None
    if custom:
        if engine not in ("auto", "torch") or precision not in ("auto", "fp32"):
            raise EngineConfigError(
                "engine and precision apply to model folders and the default model; a "
                "package.module:Name model runs its own code (leave them at auto)"
            )
        return
    on_gpu = [device for device in devices if device.strip().startswith("cuda")]
    on_cpu = [device for device in devices if not device.strip().startswith("cuda")]
    if precision == "fp16" and on_cpu:
        raise EngineConfigError(
            "precision fp16 runs on a GPU only (--device cuda); on a CPU use bf16, fp32 or auto"
        )
    if engine in ("onnxruntime", "openvino"):
        if on_gpu:
            raise EngineConfigError(
                f"engine {engine} runs on the CPU here; on {on_gpu[0]} use --engine torch or auto"
            )
        if task is not None and task not in ENGINE_TASKS:
            raise EngineConfigError(
                f"engine {engine} serves the tasks {', '.join(ENGINE_TASKS)} and sentence "
                f"embedders; task {task} runs on torch (use --engine torch or auto)"
            )
        if precision == "bf16" and engine == "onnxruntime":
            raise EngineConfigError(
                "onnxruntime runs fp32 here; use --precision fp32 or auto, or --engine openvino "
                "for bf16"
            )
        if not installed(engine):
            raise EngineConfigError(f"engine {engine} is not installed: {_INSTALL[engine]}")
    if precision in ("bf16", "fp16") and task is not None and task not in ENGINE_TASKS:
        raise EngineConfigError(
            f"precision {precision} is checked for the tasks {', '.join(ENGINE_TASKS)}; "
            f"task {task} runs fp32 (use --precision fp32 or auto)"
        )
