"""One measured run: warm up, scrape ``/metrics``, send the load, scrape again, summarise.

The result is a plain JSON-able document; every command (``run`` and each experiment point)
produces one, so their files read alike.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import sys
from dataclasses import dataclass, replace
from typing import Any

from load_test.client import LoadSpec, Recorder, RunResult, Target, client_facts, run_load
from load_test.metrics_scrape import batch_report, fetch_metrics
from load_test.schedule import expected_count
from load_test.stats import (
    Columns,
    latency_summary,
    percentile,
    phase_summaries,
    self_check,
    summarize,
    timeline,
)

__all__ = ["Measured", "measure", "metrics_url_for", "progress_enabled"]


@dataclass(slots=True)
class Measured:
    """A run's document and the raw result behind it (for plots)."""

    doc: dict[str, Any]
    result: RunResult

    def ok_latencies_ms(self) -> list[float]:
        rec = self.result.records
        return [
            (rec.done[i] - rec.intended[i]) * 1000 for i in range(len(rec)) if rec.status[i] == 200
        ]


def metrics_url_for(target: Target) -> str:
    return target.url("/metrics")


def progress_enabled(forced: bool | None) -> bool:
    """Progress bars go to stderr: on for a terminal, off otherwise unless forced."""
    return sys.stderr.isatty() if forced is None else forced


class _Bar:
    """A tqdm bar fed from the run's periodic progress hook, never per request."""

    def __init__(self, spec: LoadSpec, label: str) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

        if spec.requests is not None:
            total: float = spec.requests
            unit = "req"
        elif spec.duration is not None:
            total, unit = spec.duration, "s"
        else:
            total, unit = expected_count(spec.segments), "req"
        self._by_time = unit == "s"
        self._bar = tqdm(
            total=round(total, 1) if self._by_time else int(total),
            unit=unit,
            desc=f"{label}: " if label else None,
            file=sys.stderr,
            leave=False,
            dynamic_ncols=True,
            # tqdm prefixes the postfix with ", ", so it reads well inside the brackets.
            bar_format="{desc}{percentage:3.0f}%|{bar}| {n}/{total} {unit} "
            "[{elapsed}<{remaining}{postfix}]",
        )

    def __call__(self, records: Recorder, elapsed: float) -> None:
        done = len(records)
        position = min(elapsed, self._bar.total) if self._by_time else done
        self._bar.n = round(position, 1) if self._by_time else position
        rate = records.ok / elapsed if elapsed > 0 else 0.0
        self._bar.set_postfix_str(
            f"ok {records.ok} failed {done - records.ok} | {rate:.1f} req/s", refresh=False
        )
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


def _columns(rec: Recorder) -> Columns:
    return Columns(
        rec.intended, rec.dispatched, rec.sent, rec.done, rec.status, rec.items, rec.phase
    )


def _ms(value: float) -> float | None:
    return None if math.isnan(value) else round(value * 1000, 3)


def _client_report(result: RunResult, summary: dict[str, Any]) -> dict[str, Any]:
    spec = result.spec
    rec = result.records
    lags = sorted(d - i for d, i in zip(rec.dispatched, rec.intended, strict=True))
    waits = sorted(s - d for s, d in zip(rec.sent, rec.dispatched, strict=True))
    loop_lags = sorted(result.loop_lags)
    wall = max(result.wall_s, 1e-9)
    cpu_fraction = result.cpu_s / wall
    server_cores = None if result.server_cpu_s is None else result.server_cpu_s / wall
    other_cores = None
    cpus = os.cpu_count() or 1
    if server_cores is not None and result.machine_cpu_busy is not None:
        other_cores = max(result.machine_cpu_busy * cpus - server_cores - cpu_fraction, 0.0)
    mean_gap = None
    offered = None
    if spec.mode == "open" and len(rec) > 1:
        span = max(rec.intended) - min(rec.intended)
        mean_gap = span / (len(rec) - 1)
        offered = (len(rec) - 1) / span if span > 0 else None
    connections_full = spec.mode == "open" and result.max_in_flight >= spec.max_connections
    achieved = summary["throughput"]["requests_per_s"] if offered else None
    latency_p99 = summary["latency"]["p99_ms"]
    findings = self_check(
        mode=spec.mode,
        cpu_fraction=cpu_fraction,
        send_lag_p99_s=percentile(lags, 99) if lags else None,
        mean_gap_s=mean_gap,
        connection_wait_p99_s=percentile(waits, 99) if waits else None,
        connections_full=connections_full,
        loop_lag_p99_s=percentile(loop_lags, 99) if loop_lags else None,
        offered_per_s=offered,
        achieved_per_s=achieved,
        error_rate=summary["error_rate"],
        machine_busy=result.machine_cpu_busy,
        other_cores=other_cores,
        latency_p99_s=None if latency_p99 is None else latency_p99 / 1000,
    )
    return {
        "cpu_fraction_of_one_core": round(cpu_fraction, 4),
        "machine_cpu_busy": None
        if result.machine_cpu_busy is None
        else round(result.machine_cpu_busy, 4),
        "server_cpu_cores": None if server_cores is None else round(server_cores, 3),
        "other_cpu_cores": None if other_cores is None else round(other_cores, 3),
        "send_lag": latency_summary(lags) if spec.mode == "open" else None,
        "connection_wait": latency_summary(waits),
        "loop_lag_p99_ms": _ms(percentile(loop_lags, 99)),
        "offered_requests_per_s": None if offered is None else round(offered, 3),
        "max_in_flight": result.max_in_flight,
        "connections_opened": result.connections_opened,
        "facts": client_facts(),
        "warnings": findings.warnings,
        "notes": findings.notes,
    }


def _load_description(target: Target, spec: LoadSpec) -> dict[str, Any]:
    payloads = spec.payloads
    sizes = [p.items for p in payloads.payloads]
    load: dict[str, Any] = {
        "mode": spec.mode,
        "api": payloads.api,
        "path": payloads.path,
        "items_per_request": {"min": min(sizes), "max": max(sizes)},
        "requests_limit": spec.requests,
        "duration_limit_s": spec.duration,
        "timeout_s": spec.timeout,
    }
    if payloads.api == "grpc":
        load["grpc_target"] = spec.grpc_target or target.grpc_default
    if spec.mode == "closed":
        load["concurrency"] = spec.concurrency
    else:
        load["arrival"] = spec.process
        load["seed"] = spec.seed
        load["max_connections"] = spec.max_connections
        load["segments"] = [
            {"start_rate": s.start, "end_rate": s.end, "duration_s": s.duration}
            for s in spec.segments
        ]
    return load


def measure(
    target: Target,
    spec: LoadSpec,
    *,
    warmup: int = 0,
    scrape: bool = True,
    metrics_url: str | None = None,
    progress: bool = False,
    label: str = "",
    timeline_window: float | None = None,
    server_pid: int | None = None,
) -> Measured:
    """Run ``spec`` against ``target`` and return its document.

    ``warmup`` requests go first, closed loop, unrecorded: the first batches of a model pay
    for lazy initialisation that a steady server does not. The batch histogram is scraped
    after the warm-up so it covers the measured requests only.
    """
    if warmup > 0:
        clients = spec.concurrency or min(8, spec.max_connections)
        warm = replace(spec, concurrency=clients, segments=(), requests=warmup, duration=None)
        asyncio.run(run_load(target, warm))
    url = metrics_url or metrics_url_for(target)
    before = fetch_metrics(url) if scrape else None
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    bar = _Bar(spec, label) if progress else None
    try:
        result = asyncio.run(run_load(target, spec, bar, server_pid))
    finally:
        if bar is not None:
            bar.close()
    after = fetch_metrics(url) if scrape else None
    cols = _columns(result.records)
    summary = summarize(cols, result.start, result.records.errors)
    doc: dict[str, Any] = {
        "tool": "load_test",
        "label": label,
        "target": target.base,
        "started_at": started_at,
        "load": _load_description(target, spec),
        "warmup_requests": warmup,
        "summary": summary,
    }
    if spec.mode == "open":
        phases = []
        offset = 0.0
        for segment in spec.segments:
            duration = segment.duration
            if math.isinf(duration):
                duration = max(result.end - result.start - offset, 1e-9)
            phases.append(((segment.start + segment.end) / 2, offset, duration))
            offset += duration
        doc["phases"] = phase_summaries(cols, result.start, phases)
    window = timeline_window or max(0.25, round(result.wall_s / 60, 2))
    doc["timeline_window_s"] = window
    doc["timeline"] = timeline(cols, result.start, window)
    doc["client"] = _client_report(result, summary)
    doc["server_batches"] = batch_report(before, after) if scrape else None
    doc["metrics_url"] = url if scrape else None
    return Measured(doc, result)
