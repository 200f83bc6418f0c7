"""The trials of an engine choice, during a load that finds no decision in the cache: every
variant the options allow built, checked against torch fp32 on the calibration batches and its
memory noted; the survivors timed side by side (:mod:`.interleave`) at the batch sizes the
server runs and the lengths its traffic has (:mod:`.lengths`); then :func:`~.decision.decide`
picks, and the decision (with what the measuring learnt, and whether other processes disturbed
the timings beyond its margins) is saved in the cache."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any

import numpy as np

from .accuracy import compare
from .cache import EngineCache, ExportFailed
from .decision import REFERENCE, Decision, Measurement, Route, decide, variant_name
from .engine_options import EngineOptions, thread_budget
from .interleave import Timings, disturbed, time_interleaved
from .job import EngineJob
from .lengths import TrafficLengths, combined_rate, shorter, timing_lengths, weights
from .measure import grown_mb, items_per_second, resident_mb
from .plan import EnginePlan, Runner
from .variants import build_runner, export_folder

__all__ = ["measure_and_decide"]

logger = logging.getLogger("batching.engines")

#: A variant this many times slower than the fastest so far at batch 1 is not timed further
#: (bf16 emulated on a CPU without bf16 instructions would take minutes at the batch cap; and
#: torch, timed last, need not be timed at the batch cap where an engine is twice as fast).
_TOO_SLOW = 2.0
#: The order variants are timed in: the usually fastest first, so the slow ones stop early.
_TIMING_ORDER = {"openvino": 0, "onnxruntime": 1, "torch": 2}


def measure_and_decide(
    job: EngineJob, cache: EngineCache, variants: list[tuple[str, str]], setup: dict[str, Any]
) -> EnginePlan:
    from . import torch_engine

    options = job.options
    name = options.model_name
    sizes = sorted(set(options.batch_sizes))
    export_error = None
    if any(engine != "torch" for engine, _ in variants):
        try:  # first, so that its memory is not counted as any variant's
            export_folder(job, cache)
        except ExportFailed as exc:
            export_error = f"export failed: {exc}"
    before = resident_mb()
    reference = job.load_reference()
    reference_mb = job.reference_mb if job.reference_mb is not None else grown_mb(before)
    calibration = list(job.calibration())
    reference_runner = torch_engine.TorchRunner(reference, "fp32")
    expected = np.concatenate([job.view(reference_runner(batch), batch) for batch in calibration])
    logger.info(
        "model %s: checking %s against torch fp32 on %d calibration inputs, then timing "
        "them side by side at batch sizes %s",
        name,
        ", ".join(variant_name(*variant) for variant in variants),
        len(expected),
        "/".join(str(size) for size in sizes),
    )
    measurements: list[Measurement] = []
    checked: dict[str, Measurement] = {}
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
                runner = build_runner(job, cache, engine, precision, reference)
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
                    memory_mb=reference_mb if variant == REFERENCE else grown_mb(before),
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
        if fastest is None or first_rate > fastest[1]:
            fastest = (variant, first_rate)
        memory = reference_mb if variant == REFERENCE else grown_mb(before)
        checked[variant] = Measurement(
            engine,
            precision,
            accuracy=accuracy.figure,
            accuracy_text=accuracy.text,
            memory_mb=memory,
        )
        runners[variant] = runner
    seen = TrafficLengths.load(cache.folder)
    longest = _tokens(job.sample(sizes[0]))
    lengths = timing_lengths(longest, seen)
    weighting = weights(lengths, seen)
    batches = {
        (size, tokens): shorter(sample, tokens)
        for size in sizes
        for sample in [job.sample(size)]
        for tokens in lengths
    }
    timings = time_interleaved(runners, batches)
    for variant, found in checked.items():
        measurements.append(_timed(found, timings, sizes, lengths, weighting))
        logger.info(
            "model %s: %s %s, %s items/s at batch %s (%s tokens: %s), +%s MB",
            name,
            variant,
            found.accuracy_text,
            "/".join(f"{rate:.0f}" for rate in measurements[-1].items_per_s.values()),
            "/".join(str(size) for size in sizes),
            "/".join(str(tokens) for tokens in lengths),
            ", ".join(f"{weighting[tokens]:.0%}" for tokens in lengths),
            "?" if found.memory_mb is None else f"{found.memory_mb:.0f}",
        )
    measurements.sort(key=lambda m: variants.index((m.engine, m.precision)))
    others = {size: timings.others_at(size) for size in sizes}
    decision = dataclasses.replace(
        _decide(measurements, max(sizes), options),
        busy_cores=timings.others_overall(),
        disturbed=disturbed(measurements, others, thread_budget()),
    )
    plan = EnginePlan(decision, {**runners, REFERENCE: reference_runner})
    notes: dict[str, Any] = {"measured_at": time.time()}
    if job.check_tokenizer is not None:
        notes["tokenizer_json_differs"] = job.check_tokenizer()
    plan.notes = notes
    plan.cache_folder = cache.folder
    cache.save_decision(setup, {"decision": decision.to_json(), **notes})
    if decision.busy:
        logger.info(
            "model %s: other processes used up to %.1f cores while the variants were timed, "
            "more than the winners' margins allow: the decision serves for now and is "
            "measured again once the machine is quiet",
            name,
            max(others.values(), default=0.0),
        )
    return plan


def _tokens(batch: Any) -> int:
    ids = next(iter(batch.values()))
    shape = getattr(ids, "shape", None)
    return int(shape[1]) if shape is not None and len(shape) == 2 else 1


def _timed(
    found: Measurement,
    timings: Timings,
    sizes: list[int],
    lengths: tuple[int, ...],
    weighting: dict[int, float],
) -> Measurement:
    """``found`` with its rates: per length, and combined at the traffic's lengths."""
    rates = timings.rates[found.name]
    by_length = {tokens: {size: rates[(size, tokens)] for size in sizes} for tokens in lengths}
    combined = {
        size: combined_rate({tokens: by_length[tokens][size] for tokens in lengths}, weighting)
        for size in sizes
    }
    return dataclasses.replace(
        found,
        items_per_s=combined,
        by_length=by_length,
        busy_cores=timings.others_overall(),
    )


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
