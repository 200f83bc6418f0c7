"""Choosing what runs a model, during its instance's load (before it reports ready).

For each (engine, precision) variant the options allow: build it (exporting the model to
ONNX first, once, into the cache), check its outputs against torch fp32 on a calibration set,
time it at the batch sizes the server will run, and note the memory it added. Then
:func:`~.decision.decide` picks, the variants not kept are dropped, and the decision is
saved in the cache so that the next instance or start-up on this machine reuses it instead of
measuring again. An engine asked for by name that cannot be exported or fails the check falls
back to torch fp32, with one log line saying why.

The variants and their runners are :mod:`.variants`'; measuring them, :mod:`.trials`'. A model
that can be rebuilt in another process passes ``measure_apart``: the export, the check and the
timing (which need torch) then run in a child process that exits
(:mod:`.measuring_child`), and this process builds only the chosen runners from the cache, so a
server whose engine is not torch never imports torch. Measurements taken while other processes kept
the cores busy are marked so, and retaken in the background once the server has been idle
(:mod:`.remeasure`); the choice is revisited then.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

from .cache import EngineCache
from .contention import Contention
from .decision import REFERENCE, Decision, RetakeRule, Route
from .engine_options import ADAPTIVE_THREADS_VARIABLE, thread_budget
from .governor import ThreadGovernor, thread_choices
from .idle import IdleRelease
from .job import EngineJob
from .lengths import TrafficLengths
from .measuring_child import ApartFailed
from .plan import EnginePlan, Runner
from .quick import provisional_choice
from .remeasure import Retaker
from .shared import shared_runner
from .trials import measure_and_decide
from .variants import build_runner, candidates

__all__ = ["PROVISIONAL_IDLE_S", "measure_engines", "select_engine"]

logger = logging.getLogger("batching.engines")

#: A provisional decision (a first start serving a safe variant) is measured once the server
#: has run no batch for this long on a quiet machine.
PROVISIONAL_IDLE_S = 2.0


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
    measured_now = False
    with cache.locked():
        plan = _reuse(job, cache, setup)
    if plan is None and job.measure_apart is not None:
        measured_now = _measure_apart(job, force=False)
        with cache.locked():
            plan = _reuse(job, cache, setup)
    if (
        plan is not None
        and plan.decision.busy
        and not options.quick_start
        and job.measure_apart is not None
    ):
        # --prepare: a provisional or disturbed decision is measured again now.
        measured_now = _measure_apart(job, force=True)
        with cache.locked():
            plan = _reuse(job, cache, setup) or plan
    if plan is None:
        with cache.locked():
            plan = _reuse(job, cache, setup)
            if plan is None:
                plan = measure_and_decide(job, cache, variants, setup)
                measured_now = True
    plan.lengths = TrafficLengths.load(cache.folder)
    _adapt_threads(plan, job, cache, plan.runners)
    # Compiling read every page of the mapped weights: drop those the runners do not read.
    plan.release_memory()
    logger.info(
        "model %s: engine %s%s (%.1fs)",
        options.model_name,
        plan.decision.describe(),
        "; measured now"
        if measured_now
        else f"; measured earlier, reused from {plan.reused}"
        if plan.reused
        else "",
        time.perf_counter() - started,
    )
    if job.measure_apart is not None:
        IdleRelease(plan).start()
    if plan.decision.busy and job.measure_apart is not None:
        if plan.decision.provisional:
            rule = RetakeRule(first_idle_s=PROVISIONAL_IDLE_S)
        else:
            rule = RetakeRule()
            logger.info(
                "model %s: measured while other processes used %.1f cores, more than the "
                "margins allow: measuring again once the machine is quiet",
                options.model_name,
                plan.decision.busy_cores or 0.0,
            )
        Retaker(plan, functools.partial(_retake, job, cache, setup), rule).start()
    return plan


def _measure_apart(job: EngineJob, force: bool) -> bool:
    """Measure in the child process; whether it did (its failure is logged)."""
    assert job.measure_apart is not None
    try:
        job.measure_apart(force)
    except ApartFailed as exc:
        logger.warning("model %s: %s; measuring here", job.options.model_name, exc)
        return False
    return True


def measure_engines(job: EngineJob, force: bool = False) -> None:
    """Export, check, time and decide, and keep the decision in the cache (unless it is
    there already and ``force`` is false): what ``measure_apart`` runs in its child."""
    gpu = job.device.startswith("cuda")
    variants = candidates(job.options, gpu=gpu, measurable=job.measure is not None)
    cache, setup = _cache_of(job)
    options = job.options
    with cache.locked():
        if not force and cache.decision(setup) is not None:
            return
        # A choice to make (more than one variant) is made after the start, not before it.
        quick = not force and options.apart and options.quick_start and len(variants) > 1
        if quick and provisional_choice(job, cache, variants, setup):
            return
        measure_and_decide(job, cache, variants, setup)


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
        for size in sorted(set(job.options.batch_sizes)):  # warm, before it serves
            plan(job.sample(size))
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
                runners[route.name] = build_runner(job, cache, route.engine, route.precision, None)
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
            if getattr(runner, "model", None) is not None:
                # The same weights, compiled for another thread count.
                threaded: Runner = runner.on_threads(count)  # type: ignore[attr-defined]
                return threaded
            assert cache is not None  # only torch variants are planned without a cache
            return build_runner(job, cache, route.engine, route.precision, None, threads=count)
        from . import torch_engine

        # torch variants share one model: the thread count is set per call.
        shared: Runner = torch_engine.on_threads(runner, count)
        return shared

    contention = Contention.for_budget(budget)
    governor = ThreadGovernor(choices, contention.others if contention is not None else None)
    plan.adapt_threads(governor, build, ran=contention.ran if contention is not None else None)
    logger.info(
        "model %s: batches run on %s threads, whichever measures faster for their size",
        job.options.model_name,
        " or ".join(str(count) for count in choices),
    )
