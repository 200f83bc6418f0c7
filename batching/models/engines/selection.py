"""Choosing what runs a model, during its instance's load (before it reports ready).

For each (engine, precision) variant the options allow: build it (exporting the model to
ONNX first, once, into the cache), check its outputs against torch fp32 on a calibration set,
time it at the batch sizes the server will run, and note the memory it added. Then
:func:`~.decision.decide` picks, the variants not kept are dropped, and the decision is
saved in the cache so that the next instance or start-up on this machine reuses it instead of
measuring again. An engine asked for by name that cannot be exported or fails the check falls
back to torch fp32, with one log line saying why.

A model that can be rebuilt in another process passes ``measure_apart``: the export, the check
and the timing (which need torch) then run in a child process that exits
(:mod:`.apart`), and this process builds only the chosen runners from the cache, so a server
whose engine is not torch never imports torch. Measurements taken while other processes kept
the cores busy are marked so, and retaken in the background once the server has been idle
(:mod:`.retake`); the choice is revisited then.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .accuracy import compare
from .apart import ApartFailed
from .cache import FUSED, PLAIN, EngineCache, ExportFailed
from .contention import Contention
from .decision import REFERENCE, Decision, Measurement, Route, decide, others_cores, variant_name
from .governor import ThreadGovernor, thread_choices
from .idle import IdleRelease
from .measure import cpu_seconds, items_per_second, resident_mb
from .options import ADAPTIVE_THREADS_VARIABLE, EngineOptions, installed, thread_budget
from .plan import EnginePlan, Runner
from .retake import Retaker
from .shared import shared_runner

__all__ = ["EngineJob", "candidates", "measure_engines", "select_engine"]

logger = logging.getLogger("batching.engines")

#: A variant this many times slower than the fastest so far at batch 1 is not timed further
#: (bf16 emulated on a CPU without bf16 instructions would take minutes at the batch cap; and
#: torch, timed last, need not be timed at the batch cap where an engine is twice as fast).
_TOO_SLOW = 2.0
#: The order variants are timed in: the usually fastest first, so the slow ones stop early.
_TIMING_ORDER = {"openvino": 0, "onnxruntime": 1, "torch": 2}


@dataclass(frozen=True, slots=True)
class EngineJob:
    """What :func:`select_engine` needs of a model, whatever its task.

    :param folder: the model folder (exported, and hashed for the cache key).
    :param head: what is exported (a key of ``export.HEADS``).
    :param measure: the accuracy measure (``accuracy.MEASURES``); None: the task has none,
        and only torch at fp32 can serve it.
    :param device: "cpu" or "cuda:N".
    :param input_names: the tokenizer's tensors, in order (the exported graph's inputs).
    :param load_reference: loads the model in fp32 on ``device``, in eval mode.
    :param view: what the accuracy check compares, from a runner's output and its batch
        (pooled vectors, scores, logits at the masks), as a numpy array.
    :param calibration: the calibration batches, encoded.
    :param sample: an encoded batch of n warm-up items, for timing.
    :param reference_mb: the memory the fp32 model took, when it was loaded before the job.
    :param measure_apart: measures in a child process that exits (``measure_apart(force)``
        runs :func:`measure_engines` there; ``force`` measures again over a cached decision);
        None: measured in this process.
    :param check_tokenizer: in the measuring process, whether the folder's ``tokenizer.json``
        tokenises as transformers does (None if so, else what differs); kept in the cache.
    """

    options: EngineOptions
    folder: Path
    head: str
    measure: str | None
    device: str
    input_names: tuple[str, ...] | Callable[[], tuple[str, ...]]
    load_reference: Callable[[], Any]
    view: Callable[[Any, Any], np.ndarray]
    calibration: Callable[[], Sequence[Any]]
    sample: Callable[[int], Any]
    reference_mb: float | None = None
    measure_apart: Callable[[bool], None] | None = None
    check_tokenizer: Callable[[], str | None] | None = None

    def names(self) -> tuple[str, ...]:
        names = self.input_names
        return names if isinstance(names, tuple) else names()


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


def select_engine(job: EngineJob) -> EnginePlan:
    """Decide (or reuse the decision), build the runners kept, and return the plan."""
    options = job.options
    gpu = job.device.startswith("cuda")
    variants = candidates(options, gpu=gpu, measurable=job.measure is not None)
    if variants == [("torch", "fp32")]:
        from . import torch_engine

        runner = shared_runner(
            (str(job.folder), job.head, job.device, REFERENCE),
            lambda: torch_engine.TorchRunner(job.load_reference(), "fp32"),
        )
        route = Route("torch", "fp32", 1, max(options.batch_sizes))
        why = "asked for" if options.engine == "torch" else "the only variant for this task"
        only = EnginePlan(Decision((route,), why), {REFERENCE: runner})
        _adapt_threads(only, job, None, {REFERENCE: runner})
        return only
    started = time.perf_counter()
    cache, setup = _cache_of(job)
    with cache.locked():
        plan = _reuse(job, cache, setup)
    if plan is None and job.measure_apart is not None:
        try:
            job.measure_apart(False)
        except ApartFailed as exc:
            logger.warning("model %s: %s; measuring here", options.model_name, exc)
        with cache.locked():
            plan = _reuse(job, cache, setup)
    if plan is None:
        with cache.locked():
            plan = _reuse(job, cache, setup) or _measure_and_decide(job, cache, variants, setup)
    _adapt_threads(plan, job, cache, plan.runners)
    logger.info(
        "model %s: engine %s%s (%.1fs)",
        options.model_name,
        plan.decision.describe(),
        f"; measured earlier, reused from {plan.reused}" if plan.reused else "",
        time.perf_counter() - started,
    )
    if job.measure_apart is not None:
        IdleRelease(plan).start()
    if plan.decision.busy and job.measure_apart is not None:
        logger.info(
            "model %s: measured while other processes used %.1f cores: measuring again once "
            "the server has been idle",
            options.model_name,
            plan.decision.busy_cores or 0.0,
        )
        Retaker(plan, functools.partial(_retake, job, cache, setup)).start()
    return plan


def measure_engines(job: EngineJob, force: bool = False) -> None:
    """Export, check, time and decide, and keep the decision in the cache (unless it is
    there already and ``force`` is false): what ``measure_apart`` runs in its child."""
    gpu = job.device.startswith("cuda")
    variants = candidates(job.options, gpu=gpu, measurable=job.measure is not None)
    cache, setup = _cache_of(job)
    with cache.locked():
        if force or cache.decision(setup) is None:
            _measure_and_decide(job, cache, variants, setup)


def _cache_of(job: EngineJob) -> tuple[EngineCache, dict[str, Any]]:
    options = job.options
    cache = EngineCache(options.cache_path, job.folder, job.head)
    setup = {
        "engine": options.engine,
        "precision": options.precision,
        "device": "cuda" if job.device.startswith("cuda") else "cpu",
        "threads": thread_budget(),
        "batch_sizes": sorted(set(options.batch_sizes)),
        "cpu": _cpu_name(),
        "measure": job.measure,
    }
    return cache, setup


def _retake(job: EngineJob, cache: EngineCache, setup: dict[str, Any]) -> EnginePlan | None:
    """Measure again in a child process, and the plan of the new decision (None: nothing
    new could be read)."""
    assert job.measure_apart is not None
    job.measure_apart(True)
    with cache.locked():
        plan = _reuse(job, cache, setup)
    if plan is not None:
        _adapt_threads(plan, job, cache, plan.runners)
    return plan


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown"


def _reuse(job: EngineJob, cache: EngineCache, setup: dict[str, Any]) -> EnginePlan | None:
    saved = cache.decision(setup)
    if saved is None:
        return None
    try:
        decision = Decision.from_json(saved["decision"])
        runners: dict[str, Runner] = {}
        for route in decision.routes:
            if route.name not in runners:
                runners[route.name] = _build(job, cache, route.engine, route.precision, None)
    except Exception as exc:  # a cache emptied by hand, a library gone: measure again
        logger.info("model %s: cached engine choice unusable (%s)", job.options.model_name, exc)
        return None
    plan = EnginePlan(decision, runners, reused=str(cache.folder))
    plan.cache_folder = cache.folder
    plan.notes = {key: value for key, value in saved.items() if key not in ("decision", "setup")}
    return plan


def _adapt_threads(
    plan: EnginePlan, job: EngineJob, cache: EngineCache | None, runners: dict[str, Runner]
) -> None:
    """Let the thread governor pick each batch's thread count, unless the count was fixed
    (``--torch-threads N``), the budget is one thread, or the model runs on a GPU."""
    budget = thread_budget()
    choices = thread_choices(budget)
    fixed = os.environ.get(ADAPTIVE_THREADS_VARIABLE, "1") == "0"
    if fixed or len(choices) < 2 or job.device.startswith("cuda"):
        return
    routes = {route.name: route for route in plan.decision.routes}

    def build(name: str, count: int) -> Runner:
        runner = runners[name]
        route = routes[name]
        if route.engine != "torch":
            if count == budget:
                return runner
            assert cache is not None  # only torch variants are planned without a cache
            logger.info(
                "model %s: building %s on %d threads (the thread governor tries it)",
                job.options.model_name,
                name,
                count,
            )
            return _build(job, cache, route.engine, route.precision, None, threads=count)
        from . import torch_engine

        # torch variants share one model: the thread count is set per call.
        threaded: Runner = torch_engine.on_threads(runner, count)
        return threaded

    contention = Contention.for_budget(budget)
    governor = ThreadGovernor(choices, contention.others if contention is not None else None)
    plan.adapt_threads(governor, build, ran=contention.ran if contention is not None else None)
    logger.info(
        "model %s: batches run on %s threads, whichever measures faster for their size",
        job.options.model_name,
        " or ".join(str(count) for count in choices),
    )


def _build(
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
    if reference is None:
        key = (str(cache.folder), engine, precision, threads or thread_budget(), job.device)
        return shared_runner(
            key, lambda: _build_new(job, cache, engine, precision, None, threads=threads)
        )
    return _build_new(job, cache, engine, precision, reference, threads=threads)


def _build_new(
    job: EngineJob,
    cache: EngineCache,
    engine: str,
    precision: str,
    reference: Any,
    *,
    threads: int | None = None,
) -> Runner:
    if engine == "torch":
        from . import torch_engine

        return torch_engine.TorchRunner(
            reference if reference is not None else job.load_reference(), precision
        )
    folder = _export(job, cache)
    threads = threads or thread_budget()
    if engine == "onnxruntime":
        from .ort_engine import OnnxRuntimeRunner

        fused = folder / FUSED
        return OnnxRuntimeRunner(fused if fused.is_file() else folder / PLAIN, threads)
    if engine == "openvino":
        from .openvino_engine import OpenVinoRunner

        # One blob cache per precision and thread count: OpenVINO 2026.4 crashed (double
        # free) compiling bf16 from a folder that held the f32 blob of the same graph.
        blobs = cache.folder / "openvino" / f"{precision}-{threads}threads"
        return OpenVinoRunner(folder / PLAIN, precision, threads, blobs)
    raise ValueError(f"unknown engine {engine!r}")


def _export(job: EngineJob, cache: EngineCache) -> Path:
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


def _measure_and_decide(
    job: EngineJob, cache: EngineCache, variants: list[tuple[str, str]], setup: dict[str, Any]
) -> EnginePlan:
    from . import torch_engine

    options = job.options
    name = options.model_name
    sizes = sorted(set(options.batch_sizes))
    export_error = None
    if any(engine != "torch" for engine, _ in variants):
        try:  # first, so that its memory is not counted as any variant's
            _export(job, cache)
        except ExportFailed as exc:
            export_error = f"export failed: {exc}"
    timing_started, machine_started, own_started = time.monotonic(), *cpu_seconds()
    before = resident_mb()
    reference = job.load_reference()
    reference_mb = job.reference_mb if job.reference_mb is not None else _grown(before)
    calibration = list(job.calibration())
    reference_runner = torch_engine.TorchRunner(reference, "fp32")
    expected = np.concatenate([job.view(reference_runner(batch), batch) for batch in calibration])
    logger.info(
        "model %s: checking %s against torch fp32 on %d calibration inputs, then timing "
        "them at batch sizes %s",
        name,
        ", ".join(variant_name(*variant) for variant in variants),
        len(expected),
        "/".join(str(size) for size in sizes),
    )
    measurements: list[Measurement] = []
    runners: dict[str, Runner] = {}
    fastest: tuple[str, float] | None = None  # at the smallest batch size, so far
    timing_order = sorted(variants, key=lambda v: (_TIMING_ORDER.get(v[0], 9), v[1] != "bf16"))
    for engine, precision in timing_order:
        variant = variant_name(engine, precision)
        if engine != "torch" and export_error is not None:
            measurements.append(Measurement(engine, precision, error=export_error))
            continue
        before = resident_mb()
        try:
            if variant == REFERENCE:
                runner: Runner = reference_runner
            else:
                runner = _build(job, cache, engine, precision, reference)
            # Timed at the smallest size first: a variant over _TOO_SLOW slower there than
            # one already checked is dropped without its accuracy check (seconds of a fresh
            # start for a slow variant on long calibration texts).
            smallest = sizes[0]
            first_rate = items_per_second(functools.partial(runner, job.sample(smallest)), smallest)
            too_slow = fastest is not None and first_rate * _TOO_SLOW < fastest[1]
            if too_slow or variant == REFERENCE:
                outputs = expected  # not checked, or the reference itself
            else:
                outputs = np.concatenate([job.view(runner(batch), batch) for batch in calibration])
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            measurements.append(Measurement(engine, precision, error=reason))
            continue
        if too_slow:
            assert fastest is not None
            measurements.append(
                Measurement(
                    engine,
                    precision,
                    memory_mb=reference_mb if variant == REFERENCE else _grown(before),
                    error=f"over {_TOO_SLOW:g}x slower than {fastest[0]} at batch {smallest}",
                )
            )
            logger.info(
                "model %s: %s %.0f items/s at batch %d, over %gx slower than %s: not checked",
                name,
                variant,
                first_rate,
                smallest,
                _TOO_SLOW,
                fastest[0],
            )
            continue
        assert job.measure is not None
        accuracy = compare(job.measure, expected, outputs)
        if not accuracy.ok:
            measurements.append(
                Measurement(
                    engine,
                    precision,
                    accuracy=accuracy.figure,
                    accuracy_ok=False,
                    accuracy_text=accuracy.text,
                    error=f"failed the accuracy check: {accuracy.text}",
                )
            )
            continue
        rates: dict[int, float] = {smallest: first_rate}
        if fastest is None or first_rate > fastest[1]:
            fastest = (variant, first_rate)
        for size in sizes[1:]:
            batch = job.sample(size)
            rates[size] = items_per_second(functools.partial(runner, batch), size)
        memory = reference_mb if variant == REFERENCE else _grown(before)
        measurements.append(
            Measurement(
                engine,
                precision,
                items_per_s=rates,
                accuracy=accuracy.figure,
                accuracy_text=accuracy.text,
                memory_mb=memory,
            )
        )
        runners[variant] = runner
        logger.info(
            "model %s: %s %s, %s items/s at batch %s, +%s MB",
            name,
            variant,
            accuracy.text,
            "/".join(f"{rate:.0f}" for rate in rates.values()),
            "/".join(str(size) for size in rates),
            "?" if memory is None else f"{memory:.0f}",
        )
    measurements.sort(key=lambda m: variants.index((m.engine, m.precision)))
    machine, own = cpu_seconds()
    busy = others_cores(
        machine - machine_started, own - own_started, time.monotonic() - timing_started
    )
    decision = dataclasses.replace(_decide(measurements, max(sizes), options), busy_cores=busy)
    plan = EnginePlan(decision, {**runners, REFERENCE: reference_runner})
    notes: dict[str, Any] = {"measured_at": time.time()}
    if job.check_tokenizer is not None:
        notes["tokenizer_json_differs"] = job.check_tokenizer()
    plan.notes = notes
    plan.cache_folder = cache.folder
    cache.save_decision(setup, {"decision": decision.to_json(), **notes})
    if decision.busy:
        logger.info(
            "model %s: other processes used %.1f cores while the variants were timed: the "
            "measurements are marked busy",
            name,
            busy,
        )
    return plan


def _decide(measurements: list[Measurement], cap: int, options: EngineOptions) -> Decision:
    failed = [m for m in measurements if not m.usable]
    try:
        decision = decide(measurements, cap)
    except ValueError:
        reasons = "; ".join(f"{m.name}: {m.error}" for m in failed) or "nothing measured"
        # One line: the engine asked for cannot serve, so torch fp32 does.
        logger.warning("model %s: falling back to torch fp32: %s", options.model_name, reasons)
        route = Route("torch", "fp32", 1, cap)
        return Decision((route,), f"fallback: {reasons}", tuple(measurements))
    if failed:
        logger.info(
            "model %s: not used: %s",
            options.model_name,
            "; ".join(f"{m.name} ({m.error})" for m in failed),
        )
    return decision


def _grown(before: float | None) -> float | None:
    after = resident_mb()
    if before is None or after is None:
        return None
    return max(0.0, after - before)
