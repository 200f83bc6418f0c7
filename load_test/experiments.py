"""The built-in experiments: concurrency sweep, the Triton batching experiment, and tune.

Each writes a JSON file with every point's full run document, a console table, and a plot.
``triton-batching`` and ``tune`` start the server themselves, once per setting, because the
settings they compare are the server's own flags.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from load_test.client import LoadSpec, Target, run_load
from load_test.measure import Measured, measure
from load_test.report import (
    format_table,
    plot_curve,
    plot_triton,
    plot_tune,
    write_json,
)
from load_test.schedule import Segment
from load_test.serverproc import ServerProcess, ServerStartError
from load_test.stats import OTHER_CORES_LIMIT

__all__ = [
    "ServerOptions",
    "TuneConfig",
    "concurrency_sweep",
    "curve_point",
    "finalists",
    "meets_goal",
    "recommend",
    "triton_batching",
    "tune",
]


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How to start the server under test."""

    command: str
    cwd: Path | None
    model: str | None = None
    extra: tuple[str, ...] = ()
    ready_timeout: float = 300.0

    def start(self, flags: Sequence[str], log_path: Path) -> ServerProcess:
        args = list(flags)
        if self.model:
            args += ["--model", self.model]
        args += list(self.extra)
        return ServerProcess(
            args,
            command=self.command,
            cwd=self.cwd,
            log_path=log_path,
            ready_timeout=self.ready_timeout,
        )


def _mean_batch(doc: dict[str, Any]) -> float | None:
    batches = doc.get("server_batches")
    if not batches:
        return None
    total_items = sum(b["items"] for b in batches.values())
    total_batches = sum(b["batches"] for b in batches.values())
    return round(total_items / total_batches, 3) if total_batches else None


def curve_point(x: float, doc: dict[str, Any]) -> dict[str, Any]:
    """The figures of one run that tables and curves show."""
    s = doc["summary"]
    return {
        "x": x,
        "requests_per_s": s["throughput"]["requests_per_s"],
        "items_per_s": s["throughput"]["items_per_s"],
        "p50_ms": s["latency"]["p50_ms"],
        "p90_ms": s["latency"]["p90_ms"],
        "p99_ms": s["latency"]["p99_ms"],
        "max_ms": s["latency"]["max_ms"],
        "error_rate": s["error_rate"],
        "mean_batch": _mean_batch(doc),
        "other_cpu_cores": doc["client"].get("other_cpu_cores"),
        "warnings": doc["client"]["warnings"],
    }


def _fmt(value: float | None, digits: int = 1) -> str | None:
    return None if value is None else f"{value:.{digits}f}"


def _say(out: TextIO, text: str) -> None:
    print(text, file=out, flush=True)


def _say_warnings(out: TextIO, point: dict[str, Any]) -> None:
    for warning in point["warnings"]:
        _say(out, f"      WARNING: {warning}")


# --- concurrency sweep ---------------------------------------------------------------------


def concurrency_sweep(
    target: Target,
    base: LoadSpec,
    levels: Sequence[int],
    out_dir: Path,
    *,
    warmup: int,
    progress: bool,
    stop_p99_ms: float | None = None,
    scrape: bool = True,
    server_pid: int | None = None,
    title: str | None = None,
    out: TextIO = sys.stdout,
) -> dict[str, Any]:
    """Closed loop at each number of clients in ``levels``; ``sweep.json`` and ``sweep.png``."""
    points = []
    runs = []
    if warmup > 0:
        # One warm-up at a middling concurrency, so the first level is not the one that pays
        # for the model's first batches of each size.
        warm = replace(base, concurrency=min(max(levels), 32), requests=warmup, duration=None)
        asyncio.run(run_load(target, warm))
    for clients in levels:
        spec = replace(base, concurrency=clients, segments=())
        measured = measure(
            target,
            spec,
            # A round per client opens the connections before the clock starts.
            warmup=min(warmup, clients),
            scrape=scrape,
            progress=progress,
            label=f"{clients} clients",
            server_pid=server_pid,
        )
        point = curve_point(clients, measured.doc)
        points.append(point)
        runs.append(measured.doc)
        _say(out, _sweep_line(clients, point))
        _say_warnings(out, point)
        if stop_p99_ms is not None and (point["p99_ms"] or math.inf) > stop_p99_ms:
            _say(out, f"p99 above {stop_p99_ms:g} ms: sweep stops at {clients} clients")
            break
    table = _sweep_table(points)
    doc = {"experiment": "concurrency-sweep", "target": target.base, "points": points}
    doc["table_markdown"] = table
    doc["runs"] = runs
    write_json(out_dir / "sweep.json", doc)
    plot_curve(
        out_dir / "sweep.png",
        points,
        x_label="concurrent clients (closed loop)",
        title=title or f"concurrency sweep against {target.base}",
        log2_x=True,
    )
    _say(out, "\n" + table)
    return doc


def _sweep_line(clients: int, p: dict[str, Any]) -> str:
    batch = "" if p["mean_batch"] is None else f", mean batch {p['mean_batch']:.1f}"
    return (
        f"{clients:>4} clients: {p['requests_per_s']:.1f} req/s, {p['items_per_s']:.1f} items/s, "
        f"p50 {_fmt(p['p50_ms'])} p99 {_fmt(p['p99_ms'])} ms, "
        f"{p['error_rate']:.1%} failed{batch}"
    )


def _sweep_table(points: Sequence[dict[str, Any]]) -> str:
    rows = [
        [
            p["x"],
            _fmt(p["requests_per_s"]),
            _fmt(p["items_per_s"]),
            _fmt(p["p50_ms"]),
            _fmt(p["p90_ms"]),
            _fmt(p["p99_ms"]),
            _fmt(p["max_ms"]),
            _fmt(p["mean_batch"]),
            f"{p['error_rate']:.1%}",
        ]
        for p in points
    ]
    headers = ["clients", "req/s", "items/s", "p50 ms", "p90 ms", "p99 ms", "max ms"]
    return format_table([*headers, "mean batch", "failed"], rows, markdown=True)


# --- the Triton article's experiment -------------------------------------------------------


def triton_batching(
    server: ServerOptions,
    make_spec: Callable[[int], LoadSpec],
    sizes: Sequence[int],
    out_dir: Path,
    *,
    on_flags: Sequence[str],
    warmup: int,
    progress: bool,
    out: TextIO = sys.stdout,
) -> dict[str, Any]:
    """Every items-per-request size with batching off (``--max-batch-size 1``) and on.

    The server is started once per setting; ``make_spec(n)`` gives the load for ``n`` items
    per request. Writes ``triton_batching.json`` and ``triton_batching.png``.
    """
    rows = []
    runs = []
    settings = (("off", ["--max-batch-size", "1"]), ("on", list(on_flags)))
    for setting, flags in settings:
        log = out_dir / f"server-batching-{setting}.log"
        _say(out, f"starting the server with batching {setting}: {' '.join(flags) or 'defaults'}")
        with server.start(flags, log) as proc:
            _say(out, f"  ready in {proc.startup_s:.1f} s at {proc.url}")
            target = Target.parse(proc.url)
            for n in sizes:
                spec = make_spec(n)
                measured = measure(
                    target,
                    spec,
                    warmup=warmup,
                    progress=progress,
                    label=f"batching {setting}, {n} items/request",
                    server_pid=proc.pid,
                )
                point = curve_point(n, measured.doc)
                row = {"batching": setting, "items_per_request": n, **point}
                rows.append(row)
                runs.append({"batching": setting, "flags": flags, **measured.doc})
                _say(out, f"  {n:>3} items/request: " + _sweep_line(spec.concurrency or 0, point))
                _say_warnings(out, point)
    table = triton_table(rows)
    doc = {
        "experiment": "triton-batching",
        "server_command": server.command,
        "model": server.model,
        "on_flags": list(on_flags),
        "rows": rows,
        "table_markdown": table,
        "runs": runs,
    }
    write_json(out_dir / "triton_batching.json", doc)
    first = make_spec(sizes[0])
    plot_triton(
        out_dir / "triton_batching.png",
        rows,
        f"dynamic batching off vs on ({server.model or 'default model'}): "
        f"{first.concurrency} clients, {first.requests} requests per point",
    )
    _say(out, "\n" + table)
    return doc


def triton_table(rows: Sequence[dict[str, Any]]) -> str:
    by = {(r["items_per_request"], r["batching"]): r for r in rows}
    table_rows = []
    for n in sorted({r["items_per_request"] for r in rows}):
        off, on = by.get((n, "off")), by.get((n, "on"))
        speedup = None
        if off and on and off["items_per_s"]:
            speedup = f"x{on['items_per_s'] / off['items_per_s']:.2f}"
        cells: list[Any] = [n]
        for r in (off, on):
            figures = ("requests_per_s", "items_per_s", "p50_ms", "p99_ms", "mean_batch")
            cells += [_fmt(r[key] if r else None) for key in figures]
        cells.append(speedup)
        table_rows.append(cells)
    headers = ["items/req"]
    for setting in ("off", "on"):
        headers += [
            f"{setting}: req/s",
            f"{setting}: items/s",
            f"{setting}: p50 ms",
            f"{setting}: p99 ms",
            f"{setting}: batch",
        ]
    return format_table([*headers, "items/s on/off"], table_rows, markdown=True)


# --- tune ----------------------------------------------------------------------------------

#: Settings whose best throughput is within this share of the top one are re-measured.
FINALIST_SHARE = 0.9
#: Throughputs within this share of each other are a tie (run-to-run noise is larger).
TIE_SHARE = 0.98
#: Shares of the recommended throughput tried as Poisson rates, highest first.
VERIFY_SHARES = (0.9, 0.75, 0.6, 0.45, 0.3)
#: Runs of a point that other programs disturbed, before it is kept and flagged.
DISTURBED_ATTEMPTS = 3


def _disturbed(point: dict[str, Any]) -> bool:
    other = point.get("other_cpu_cores")
    return other is not None and other >= OTHER_CORES_LIMIT


@dataclass(frozen=True, slots=True)
class TuneConfig:
    """One server setting that tune tries."""

    max_batch_size: int
    max_queue_delay_ms: float
    instances: int

    @property
    def name(self) -> str:
        return (
            f"max_batch_size={self.max_batch_size} "
            f"max_queue_delay={self.max_queue_delay_ms:g}ms instances={self.instances}"
        )

    @property
    def slug(self) -> str:
        return f"b{self.max_batch_size}-d{self.max_queue_delay_ms:g}-i{self.instances}"

    def flags(self) -> list[str]:
        return [
            "--max-batch-size",
            str(self.max_batch_size),
            "--max-queue-delay-ms",
            f"{self.max_queue_delay_ms:g}",
            "--instances",
            str(self.instances),
        ]

    def setting(self) -> dict[str, Any]:
        return {
            "max_batch_size": self.max_batch_size,
            "max_queue_delay_ms": self.max_queue_delay_ms,
            "instances": self.instances,
        }


def _config_of(result: dict[str, Any]) -> TuneConfig:
    s = result["setting"]
    return TuneConfig(s["max_batch_size"], s["max_queue_delay_ms"], s["instances"])


def meets_goal(point: dict[str, Any], goal_ms: float, max_error_rate: float) -> bool:
    """A point meets the goal when its p99 is within it and few enough requests failed."""
    p99 = point.get("p99_ms")
    return p99 is not None and p99 <= goal_ms and point["error_rate"] <= max_error_rate


def recommend(
    configs: Sequence[dict[str, Any]], goal_ms: float, max_error_rate: float
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(config, point) with the highest items/s among points that meet the goal.

    When some settings were re-measured (``"confirmed"``), only their longer confirming runs
    compete, so a lucky short point cannot win; if every one of those missed the goal, the
    search points decide after all. Ties (within 2%) go to the lower p99, then to
    fewer instances and smaller batches: the cheaper setting when throughput cannot tell.
    """

    def candidates(confirmed: bool) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        found = []
        for config in configs:
            if confirmed:
                points = [config["confirmed"]] if "confirmed" in config else []
            else:
                points = config["points"]
            found += [(config, p) for p in points if meets_goal(p, goal_ms, max_error_rate)]
        return found

    pool = candidates(confirmed=True) or candidates(confirmed=False)
    if not pool:
        return None
    top = max(point["items_per_s"] for _, point in pool)
    close = [c for c in pool if c[1]["items_per_s"] >= TIE_SHARE * top]
    return min(
        close,
        key=lambda c: (
            c[1]["p99_ms"],
            c[0]["setting"]["instances"],
            c[0]["setting"]["max_batch_size"],
        ),
    )


def finalists(configs: Sequence[dict[str, Any]], limit: int = 3) -> list[dict[str, Any]]:
    """The settings whose best throughput within the goal is close enough to the top one
    that a short run cannot tell them apart."""
    scored = sorted((c for c in configs if c.get("best_point")), key=_score, reverse=True)
    if not scored:
        return []
    top = _score(scored[0])
    return [c for c in scored if _score(c) >= FINALIST_SHARE * top][:limit]


def _score(result: dict[str, Any]) -> float:
    bp = result.get("best_point")
    return bp["items_per_s"] if bp else -1.0


@dataclass(slots=True)
class _Tuner:
    server: ServerOptions
    make_spec: Callable[[int], LoadSpec]
    levels: Sequence[int]
    goal_ms: float
    max_error_rate: float
    out_dir: Path
    warmup: int
    progress: bool
    refine: int
    out: TextIO
    tried: dict[TuneConfig, dict[str, Any]] = field(default_factory=dict)
    #: Whether a server has started yet: if the first one cannot, none will (a wrong
    #: command, model or directory), and the search stops with that one error.
    started_any: bool = False

    def meets(self, point: dict[str, Any]) -> bool:
        return meets_goal(point, self.goal_ms, self.max_error_rate)

    def capacity(self, config: TuneConfig) -> dict[str, Any]:
        """Closed loop at increasing concurrency until the goal is missed or nothing gains."""
        if config in self.tried:
            return self.tried[config]
        _say(self.out, f"\n{config.name}")
        points: list[dict[str, Any]] = []
        result: dict[str, Any] = {"name": config.name, "setting": config.setting()}
        try:
            with self.server.start(config.flags(), self._log(config, "search")) as proc:
                self.started_any = True
                result["startup_s"] = round(proc.startup_s, 2)
                last_ok: int | None = None
                missed: int | None = None
                stalls = 0
                for k, clients in enumerate(self.levels):
                    point = self._point(proc, config, clients, warm=k == 0)
                    points.append(point)
                    if not self.meets(point):
                        missed = clients
                        break
                    best = max((p["items_per_s"] for p in points[:-1]), default=0.0)
                    stalls = stalls + 1 if point["items_per_s"] < 1.03 * best else 0
                    last_ok = clients
                    if stalls >= 2:
                        break  # saturated: more clients only queue
                # Bisect between the last concurrency that met the goal and the first that
                # missed it, where the best point usually lies.
                low, high = last_ok, missed
                for _ in range(self.refine):
                    if low is None or high is None or high - low < 2:
                        break
                    mid = (low + high) // 2
                    point = self._point(proc, config, mid, warm=False)
                    points.append(point)
                    low, high = (mid, high) if self.meets(point) else (low, mid)
        except RuntimeError as exc:
            if isinstance(exc, ServerStartError) and not self.started_any:
                raise
            result["error"] = str(exc)
            _say(self.out, f"  failed: {exc}")
        points.sort(key=lambda p: p["concurrency"])
        result["points"] = points
        meeting = [p for p in points if self.meets(p)]
        result["best_point"] = max(meeting, key=lambda p: p["items_per_s"], default=None)
        bp = result["best_point"]
        _say(
            self.out,
            f"  best within goal: {bp['items_per_s']:.1f} items/s at {bp['concurrency']} clients "
            f"(p99 {bp['p99_ms']:.1f} ms)"
            if bp
            else "  no concurrency met the goal",
        )
        self.tried[config] = result
        return result

    def confirm(self, result: dict[str, Any], duration: float, steps: int = 3) -> None:
        """Re-measure a finalist for longer, on a fresh server, at its best concurrency.

        A short point near the goal may have met it by luck; when the longer run misses, the
        next lower concurrency that met the goal is tried, up to ``steps`` runs in all.
        """
        config = _config_of(result)
        best = result["best_point"]["concurrency"]
        levels = sorted(
            {p["concurrency"] for p in result["points"] if self.meets(p)} - {best},
            reverse=True,
        )
        tries: list[dict[str, Any]] = []
        result["confirm_tries"] = tries
        _say(self.out, f"\nconfirming {config.name} ({duration:g} s per run)")
        try:
            with self.server.start(config.flags(), self._log(config, "confirm")) as proc:
                for k, clients in enumerate([best, *levels][:steps]):
                    point = self._point(proc, config, clients, warm=k == 0, duration=duration)
                    tries.append(point)
                    if self.meets(point):
                        result["confirmed"] = point
                        return
        except RuntimeError as exc:
            _say(self.out, f"  failed: {exc}")
            return
        _say(self.out, "  not confirmed: no longer run met the goal")

    def verify(
        self, result: dict[str, Any], point: dict[str, Any], duration: float
    ) -> dict[str, Any]:
        """The highest Poisson rate, as a share of the closed-loop throughput, within the goal.

        Closed loop never offers more than its clients can send, so it hides what bursts do;
        a setting is only as good as the random arrivals it can absorb.
        """
        config = _config_of(result)
        base = self.make_spec(point["concurrency"])
        tries: list[dict[str, Any]] = []
        _say(self.out, f"\nchecking {config.name} under Poisson arrivals ({duration:g} s each)")
        try:
            self._verify_rates(config, point, base, duration, tries)
        except RuntimeError as exc:
            _say(self.out, f"  failed: {exc}")
            return {"duration_s": duration, "tries": tries, "error": str(exc)}
        held = [p for p in tries if self.meets(p)]
        return {
            "duration_s": duration,
            "tries": tries,
            "poisson_rate_within_goal": round(held[0]["x"], 3) if held else None,
            "share_of_closed_loop": held[0]["share"] if held else None,
        }

    def _verify_rates(
        self,
        config: TuneConfig,
        point: dict[str, Any],
        base: LoadSpec,
        duration: float,
        tries: list[dict[str, Any]],
    ) -> None:
        with self.server.start(config.flags(), self._log(config, "verify")) as proc:
            for k, share in enumerate(VERIFY_SHARES):
                rate = share * point["requests_per_s"]
                spec = replace(
                    base,
                    concurrency=None,
                    segments=(Segment(rate, rate, duration),),
                    process="poisson",
                    requests=None,
                    duration=duration,
                )
                measured = measure(
                    Target.parse(proc.url),
                    spec,
                    warmup=point["concurrency"] * 4 if k == 0 else 0,
                    progress=self.progress,
                    label=f"verify {config.name} at {rate:.1f} req/s",
                    server_pid=proc.pid,
                )
                p = curve_point(rate, measured.doc)
                p["share"] = share
                tries.append(p)
                _say(
                    self.out,
                    f"  {rate:.1f} requests/s ({share:.0%}): p99 {_fmt(p['p99_ms'])} ms, "
                    f"{p['error_rate']:.1%} failed" + ("" if self.meets(p) else "  (misses)"),
                )
                _say_warnings(self.out, p)
                if self.meets(p):
                    break

    def _log(self, config: TuneConfig, stage: str) -> Path:
        return self.out_dir / f"server-{config.slug}-{stage}.log"

    def _point(
        self,
        server: ServerProcess,
        config: TuneConfig,
        clients: int,
        warm: bool,
        duration: float | None = None,
    ) -> dict[str, Any]:
        spec = replace(self.make_spec(clients), concurrency=clients, segments=())
        if duration is not None:
            spec = replace(spec, duration=duration, requests=None)
        for attempt in range(1, DISTURBED_ATTEMPTS + 1):
            measured: Measured = measure(
                Target.parse(server.url),
                spec,
                warmup=max(self.warmup, clients) if warm and attempt == 1 else clients,
                progress=self.progress,
                label=f"{config.name}, {clients} clients",
                server_pid=server.pid,
            )
            point = curve_point(clients, measured.doc)
            point["concurrency"] = clients
            _say(self.out, "  " + _sweep_line(clients, point))
            _say_warnings(self.out, point)
            point["disturbed"] = _disturbed(point)
            if not point["disturbed"]:
                break
            # A point another program slowed down would steer the search wrong: measure it
            # again, and flag it if the machine stays busy.
            if attempt < DISTURBED_ATTEMPTS:
                _say(self.out, "      other programs were busy: measuring this point again")
        return point


def tune(
    server: ServerOptions,
    make_spec: Callable[[int], LoadSpec],
    out_dir: Path,
    *,
    goal_ms: float,
    batch_sizes: Sequence[int],
    delays_ms: Sequence[float],
    instances: Sequence[int],
    levels: Sequence[int],
    search: str = "descent",
    max_error_rate: float = 0.01,
    warmup: int = 32,
    refine: int = 2,
    confirm_s: float = 0.0,
    verify_s: float = 0.0,
    progress: bool = False,
    out: TextIO = sys.stdout,
) -> dict[str, Any]:
    """Search server settings for the highest throughput whose p99 meets ``goal_ms``.

    ``search="grid"`` tries every combination; ``"descent"`` tries every batch size (at the
    middle delay, first instance count), then every delay with the best batch size, then
    every instance count with both: far fewer server starts, since the three settings
    interact weakly. ``confirm_s`` > 0 re-measures the settings within 10% of the best for
    that long before choosing (see :meth:`_Tuner.confirm`); ``verify_s`` > 0 then finds the
    Poisson rate the winner holds within the goal.
    """
    tuner = _Tuner(
        server=server,
        make_spec=make_spec,
        levels=levels,
        goal_ms=goal_ms,
        max_error_rate=max_error_rate,
        out_dir=out_dir,
        warmup=warmup,
        progress=progress,
        refine=refine,
        out=out,
    )
    if search == "grid":
        for b in batch_sizes:
            for d in delays_ms:
                for i in instances:
                    tuner.capacity(TuneConfig(b, d, i))
    else:
        middle_delay = sorted(delays_ms)[len(delays_ms) // 2]
        for b in batch_sizes:
            tuner.capacity(TuneConfig(b, middle_delay, instances[0]))
        best_config = _config_of(max(tuner.tried.values(), key=_score))
        for d in delays_ms:
            tuner.capacity(replace(best_config, max_queue_delay_ms=d))
        best_config = _config_of(max(tuner.tried.values(), key=_score))
        for i in instances:
            tuner.capacity(replace(best_config, instances=i))
    configs = list(tuner.tried.values())
    close = finalists(configs)
    if confirm_s > 0 and len(close) > 1:
        for result in close:
            tuner.confirm(result, confirm_s)
    choice = recommend(configs, goal_ms, max_error_rate)
    doc: dict[str, Any] = {
        "experiment": "tune",
        "goal": {"p99_ms": goal_ms, "max_error_rate": max_error_rate},
        "search": search,
        "model": server.model,
        "finalists": [c["name"] for c in close] if confirm_s > 0 and len(close) > 1 else [],
        "configs": configs,
    }
    if choice is None:
        doc["recommendation"] = None
    else:
        config, point = choice
        doc["recommendation"] = {
            "setting": config["setting"],
            "server_flags": _config_of(config).flags(),
            "concurrency": point["concurrency"],
            "requests_per_s": point["requests_per_s"],
            "items_per_s": point["items_per_s"],
            "p99_ms": point["p99_ms"],
            "confirmed": point is config.get("confirmed"),
        }
        if verify_s > 0:
            doc["recommendation"]["verification"] = tuner.verify(config, point, verify_s)
    disturbed = sum(
        1
        for c in configs
        for p in [*c["points"], *c.get("confirm_tries", [])]
        if p.get("disturbed")
    )
    doc["disturbed_points"] = disturbed
    table = tune_table(configs, goal_ms)
    doc["table_markdown"] = table
    write_json(out_dir / "tune.json", doc)
    plot_tune(
        out_dir / "tune.png",
        configs,
        goal_ms,
        choice[0]["name"] if choice else None,
        choice[1] if choice else None,
    )
    _say(out, "\n" + table)
    _say(out, "\n" + _recommendation_text(doc, goal_ms))
    if disturbed:
        _say(
            out,
            f"WARNING: other programs used the CPU during {disturbed} point(s), even when "
            "measured again: the search may be steered wrong; rerun on a quiet machine",
        )
    return doc


def _recommendation_text(doc: dict[str, Any], goal_ms: float) -> str:
    rec = doc["recommendation"]
    if rec is None:
        return f"no setting met p99 <= {goal_ms:g} ms at any concurrency tried"
    lines = [
        f"recommended: {' '.join(rec['server_flags'])}",
        f"  {rec['items_per_s']:.1f} items/s ({rec['requests_per_s']:.1f} requests/s) with p99 "
        f"{rec['p99_ms']:.1f} ms at {rec['concurrency']} concurrent clients"
        + (" (confirmed by a longer run)" if rec["confirmed"] else ""),
    ]
    verification = rec.get("verification")
    if verification and verification.get("error"):
        lines.append(f"  the Poisson check failed: {verification['error']}")
    elif verification:
        rate = verification["poisson_rate_within_goal"]
        if rate is None:
            lines.append(
                "  under Poisson arrivals it missed the goal even at "
                f"{VERIFY_SHARES[-1]:.0%} of that rate: bursts need more headroom"
            )
        else:
            lines.append(
                f"  under Poisson arrivals it holds p99 <= {goal_ms:g} ms up to about "
                f"{rate:.1f} requests/s ({verification['share_of_closed_loop']:.0%} of the "
                "closed-loop figure): plan capacity on this one"
            )
    return "\n".join(lines)


def tune_table(configs: Sequence[dict[str, Any]], goal_ms: float) -> str:
    rows = []
    for config in sorted(configs, key=_score, reverse=True):
        s = config["setting"]
        bp = config.get("best_point")
        confirmed = config.get("confirmed")
        rows.append(
            [
                s["max_batch_size"],
                f"{s['max_queue_delay_ms']:g}",
                s["instances"],
                bp and bp["concurrency"],
                _fmt(bp and bp["requests_per_s"]),
                _fmt(bp and bp["items_per_s"]),
                _fmt(bp and bp["p99_ms"]),
                _fmt(bp and bp["mean_batch"]),
                None
                if confirmed is None
                else f"{confirmed['items_per_s']:.1f} / {_fmt(confirmed['p99_ms'])}",
                "error" if config.get("error") else ("yes" if bp else "no"),
            ]
        )
    headers = ["max_batch_size", "delay ms", "instances", "clients", "req/s", "items/s"]
    headers += [f"p99 ms (goal {goal_ms:g})", "mean batch", "confirmed items/s / p99"]
    return format_table([*headers, "meets goal"], rows, markdown=True)
