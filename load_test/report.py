"""What a person reads or looks at: the console summary, the JSON file and PNG plots.

Plots use matplotlib's Agg backend (no display needed) and are imported lazily, so ``--help``
and the run itself do not pay for matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "format_batches",
    "format_run",
    "format_table",
    "plot_curve",
    "plot_latency",
    "plot_timeline",
    "plot_triton",
    "plot_tune",
    "write_json",
]

_OK = "#1f77b4"
_P50 = "#2ca02c"
_P90 = "#ff7f0e"
_P99 = "#d62728"
_FAIL = "#d62728"


def write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_batches(batches: dict[str, Any] | None) -> str:
    if batches is None:
        return "not exposed (no batching_batch_size_items histogram at /metrics)"
    if not batches:
        return "no batches recorded"
    parts = []
    for series, b in batches.items():
        parts.append(
            f"{series}: {b['batches']} batches, mean {b['mean_size']:.1f} items "
            f"(median in {b['p50_bucket']}, p99 in {b['p99_bucket']})"
        )
    return "; ".join(parts)


def format_run(doc: dict[str, Any]) -> str:
    """The console summary of one run."""
    load = doc["load"]
    s = doc["summary"]
    items = load["items_per_request"]
    items_text = (
        str(items["min"]) if items["min"] == items["max"] else f"{items['min']}-{items['max']}"
    )
    if load["mode"] == "closed":
        how = f"closed loop, {load['concurrency']} clients"
    else:
        rates = ", ".join(
            f"{seg['start_rate']:g}"
            if seg["start_rate"] == seg["end_rate"]
            else f"{seg['start_rate']:g}->{seg['end_rate']:g}"
            for seg in load["segments"]
        )
        how = f"open loop, {load['arrival']} arrivals at {rates} requests/s"
    lat = s["latency"]
    out = s["outcomes"]
    other = sum(out["other_http"].values())
    other_text = f"other: {other}" + (f" {out['other_http']}" if other else "")
    client = doc["client"]
    lines = [
        f"{doc['label'] or 'run'}: {how}; {load['api']} bodies, {items_text} items/request "
        f"-> {doc['target']}",
        f"  requests    {s['requests']} ({s['ok_requests']} answered 200) "
        f"in {s['duration_s']:.2f} s",
        f"  throughput  {s['throughput']['requests_per_s']:.1f} requests/s   "
        f"{s['throughput']['items_per_s']:.1f} items/s",
        f"  latency     p50 {_num(lat['p50_ms'])}  p90 {_num(lat['p90_ms'])}  "
        f"p99 {_num(lat['p99_ms'])}  max {_num(lat['max_ms'])} ms"
        + (
            "  (200 answers, from intended send time)"
            if load["mode"] == "open"
            else "  (200 answers)"
        ),
        f"  outcomes    200: {out['200']}  503: {out['503']}  504: {out['504']}  {other_text}  "
        f"connection errors: {out['connection_errors']}  timeouts: {out['timeouts']}  "
        f"invalid: {out['invalid_responses']}",
        f"  batches     {format_batches(doc['server_batches'])}",
    ]
    client_line = f"  client      CPU {client['cpu_fraction_of_one_core']:.0%} of a core"
    if client["send_lag"] is not None:
        client_line += f"; send lag p99 {_num(client['send_lag']['p99_ms'], 2)} ms"
        client_line += f"; offered {_num(client['offered_requests_per_s'])} requests/s"
    else:
        client_line += f"; event-loop lag p99 {_num(client['loop_lag_p99_ms'], 2)} ms"
    if client["machine_cpu_busy"] is not None:
        client_line += f"; machine CPU {client['machine_cpu_busy']:.0%} busy"
    if client.get("server_cpu_cores") is not None:
        client_line += (
            f" (server {client['server_cpu_cores']:.2f} cores, "
            f"others {client['other_cpu_cores']:.2f})"
        )
    lines.append(client_line)
    if out["error_kinds"]:
        kinds = ", ".join(f"{k}: {v}" for k, v in out["error_kinds"].items())
        lines.append(f"  errors      {kinds}")
    phases = doc.get("phases", [])
    for phase in phases if len(phases) > 1 else []:
        pl = phase["latency"]
        lines.append(
            f"  phase {phase['phase']}     offered {phase['offered_rate']:g}/s -> "
            f"{phase['throughput']['requests_per_s']:.1f}/s, p50 {_num(pl['p50_ms'])} "
            f"p99 {_num(pl['p99_ms'])} ms, {phase['outcomes']['200']}/{phase['requests']} ok"
        )
    for warning in client["warnings"]:
        lines.append(f"  WARNING: {warning}")
    for note in client.get("notes", []):
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], markdown: bool = False
) -> str:
    """A plain or Markdown table with right-aligned columns."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    if markdown:
        lines = [
            "| " + " | ".join(c.rjust(w) for c, w in zip(cells[0], widths, strict=True)) + " |"
        ]
        lines.append("|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
        for row in cells[1:]:
            lines.append(
                "| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |"
            )
        return "\n".join(lines)
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _pyplot().close(fig)


def _nines_x(q: float) -> float:
    # Percentile -> "number of nines", so p90, p99 and p99.9 are evenly spaced.
    return -math.log10(max(1 - q / 100, 1e-6))


def _batch_panel(ax: Axes, batches: dict[str, Any] | None) -> None:
    ax.set_title("batch sizes the server formed")
    if not batches:
        ax.text(0.5, 0.5, "no batch histogram at /metrics", ha="center", va="center")
        ax.set_axis_off()
        return
    series, b = max(batches.items(), key=lambda kv: kv[1]["batches"])
    labels = list(b["sizes"].keys())
    counts = list(b["sizes"].values())
    ax.bar(range(len(labels)), counts, color="#9467bd")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("items per batch")
    ax.set_ylabel("batches")
    ax.set_ylim(0, max(counts) * 1.25)
    ax.text(
        0.02,
        0.97,
        f"{b['batches']} batches, mean {b['mean_size']:.1f} items",
        transform=ax.transAxes,
        ha="left",
        va="top",
    )
    if len(batches) > 1:
        ax.set_title(f"batch sizes ({series})", fontsize=9)


def plot_latency(path: Path, latencies_ms: Sequence[float], doc: dict[str, Any]) -> None:
    """Latency histogram, latency by percentile and (when known) the server's batch sizes."""
    import numpy as np

    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    hist_ax, pct_ax, batch_ax = axes
    s = doc["summary"]
    fig.suptitle(
        f"{doc['label'] or 'run'}: {s['requests']} requests, "
        f"{s['throughput']['requests_per_s']:.1f} req/s, {s['throughput']['items_per_s']:.1f} "
        f"items/s, {s['error_rate']:.1%} failed",
        fontsize=11,
    )
    values = np.sort(np.asarray(latencies_ms, dtype=float))
    marks = [("p50", s["latency"]["p50_ms"], _P50), ("p90", s["latency"]["p90_ms"], _P90)]
    marks.append(("p99", s["latency"]["p99_ms"], _P99))
    if values.size == 0:
        for ax in (hist_ax, pct_ax):
            ax.text(0.5, 0.5, "no successful requests", ha="center", va="center")
            ax.set_axis_off()
    else:
        low, high = max(values[0], 1e-3), max(values[-1], 1e-3)
        if high / low > 20:
            bins = np.geomspace(low, high * 1.001, 60)
            hist_ax.set_xscale("log")
            _plain_log_axis(hist_ax, "x")
        else:
            bins = np.linspace(values[0], values[-1] + 1e-9, 60)
        hist_ax.hist(values, bins=bins, color=_OK, alpha=0.8)
        for name, value, color in marks:
            if value is not None:
                hist_ax.axvline(value, color=color, ls="--", label=f"{name} {value:.1f} ms")
        hist_ax.set_xlabel("latency (ms)")
        hist_ax.set_ylabel("requests")
        hist_ax.set_title("latency distribution (200 answers)")
        hist_ax.legend(loc="best", fontsize=9)

        # Each value plotted at the share of requests faster than it, so the slowest one sits
        # at (n-1)/n rather than at 100%, which the "nines" axis cannot show.
        below = np.arange(values.size) / values.size * 100
        pct_ax.plot([_nines_x(q) for q in below], values, color=_OK)
        last = _nines_x(below[-1])
        ticks = [t for t in (50, 90, 99, 99.9, 99.99, 99.999) if _nines_x(t) <= max(last, 1)]
        pct_ax.set_xticks([_nines_x(t) for t in ticks], [f"p{t:g}" for t in ticks])
        for name, value, color in marks:
            if value is not None:
                q = float(name[1:])
                pct_ax.plot([_nines_x(q)], [value], "o", color=color)
                pct_ax.annotate(
                    f"{value:.1f}",
                    (_nines_x(q), value),
                    textcoords="offset points",
                    xytext=(-6, 6),
                    ha="right",
                    fontsize=9,
                    color=color,
                )
        pct_ax.set_xlabel("percentile (axis spaced by nines)")
        pct_ax.set_ylabel("latency (ms)")
        pct_ax.set_title("latency by percentile")
        pct_ax.grid(alpha=0.3)
    _batch_panel(batch_ax, doc.get("server_batches"))
    fig.tight_layout()
    _save(fig, path)


def plot_timeline(path: Path, doc: dict[str, Any]) -> None:
    """Answers/s (and offered/s, failures/s) and windowed p50/p99 over the run."""
    plt = _pyplot()
    rows = doc["timeline"]
    window = doc["timeline_window_s"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    t = [r["t_s"] + window / 2 for r in rows]
    top.plot(t, [r["ok_per_s"] for r in rows], color=_OK, label="answered 200 /s")
    if doc["load"]["mode"] == "open":
        top.plot(t, [r["offered_per_s"] for r in rows], color="grey", ls="--", label="offered /s")
    failed = [r["failed"] / r["length_s"] for r in rows]
    if any(failed):
        top.bar(t, failed, width=window * 0.9, color=_FAIL, alpha=0.5, label="failed /s")
    top.set_ylabel("requests / s")
    top.legend(loc="upper left", fontsize=9)
    top.grid(alpha=0.3)
    top.set_title(f"{doc['label'] or 'run'}: over time ({window:g} s windows)")
    p50 = [math.nan if r["p50_ms"] is None else r["p50_ms"] for r in rows]
    p99 = [math.nan if r["p99_ms"] is None else r["p99_ms"] for r in rows]
    bottom.plot(t, p50, color=_P50, label="p50")
    bottom.plot(t, p99, color=_P99, label="p99")
    finite = [v for v in p50 + p99 if not math.isnan(v) and v > 0]
    if finite and max(finite) / min(finite) > 30:
        bottom.set_yscale("log")
        _plain_log_axis(bottom)
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("seconds since start")
    bottom.legend(loc="upper left", fontsize=9)
    bottom.grid(alpha=0.3)
    for phase in doc.get("phases", [])[1:]:
        for ax in (top, bottom):
            ax.axvline(phase["start_s"], color="grey", lw=0.8, alpha=0.6)
    fig.tight_layout()
    _save(fig, path)


def plot_curve(
    path: Path,
    points: Sequence[dict[str, Any]],
    *,
    x_label: str,
    title: str,
    log2_x: bool = False,
    offered_line: bool = False,
    goal_ms: float | None = None,
) -> None:
    """Throughput and latency against concurrency or rate, one point per run.

    Each point needs ``x``, ``requests_per_s``, ``items_per_s``, ``p50_ms``, ``p99_ms`` and
    may carry ``mean_batch`` (annotated) and ``error_rate`` (failures are marked).
    """
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    x = [p["x"] for p in points]
    top.plot(x, [p["requests_per_s"] for p in points], "o-", color=_OK, label="requests/s")
    if any(p["items_per_s"] != p["requests_per_s"] for p in points):
        top.plot(x, [p["items_per_s"] for p in points], "s--", color="#17becf", label="items/s")
    if offered_line:
        top.plot(x, x, ":", color="grey", label="offered")
    for p in points:
        if p.get("mean_batch") is not None:
            top.annotate(
                f"batch {p['mean_batch']:.1f}",
                (p["x"], p["items_per_s"]),
                textcoords="offset points",
                xytext=(0, 8),
                ha="center",
                fontsize=8,
                color="#9467bd",
            )
        if p.get("error_rate"):
            top.annotate(
                f"{p['error_rate']:.0%} failed",
                (p["x"], p["requests_per_s"]),
                textcoords="offset points",
                xytext=(0, -14),
                ha="center",
                fontsize=8,
                color=_FAIL,
            )
    top.set_ylabel("throughput (per second)")
    top.set_title(title)
    top.legend(loc="upper left", fontsize=9)
    top.grid(alpha=0.3)
    highest = max([p["items_per_s"] for p in points] + [p["requests_per_s"] for p in points])
    top.set_ylim(0, max(highest, 1e-9) * 1.15)
    bottom.plot(x, [_nan(p["p50_ms"]) for p in points], "o-", color=_P50, label="p50")
    bottom.plot(x, [_nan(p["p99_ms"]) for p in points], "o-", color=_P99, label="p99")
    if goal_ms is not None:
        bottom.axhline(goal_ms, color="black", ls="--", lw=1, label=f"goal {goal_ms:g} ms")
    shown = [v for p in points for v in (p["p50_ms"], p["p99_ms"]) if v]
    if shown and max(shown) / min(shown) > 10:
        bottom.set_yscale("log")
        _plain_log_axis(bottom)
    else:
        bottom.set_ylim(bottom=0)
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel(x_label)
    bottom.legend(loc="upper left", fontsize=9)
    bottom.grid(alpha=0.3, which="both")
    if log2_x:
        bottom.set_xscale("log", base=2)
        bottom.set_xticks(x, [f"{v:g}" for v in x])
    fig.tight_layout()
    _save(fig, path)


def _plain_log_axis(ax: Axes, which: str = "y") -> None:
    # Log scale with tick labels written as plain numbers (20, 50, 100), not 2x10^1.
    from matplotlib.ticker import FuncFormatter, LogLocator

    axis = ax.yaxis if which == "y" else ax.xaxis
    low, high = ax.get_ylim() if which == "y" else ax.get_xlim()
    decades = math.log10(high / low) if low > 0 and high > low else 3.0
    # More labelled ticks on a short axis, fewer on a long one, so labels never crowd.
    subs = (
        (1.0, 2.0, 3.0, 5.0, 7.0) if decades < 1.5 else (1.0, 2.0, 5.0) if decades < 3 else (1.0,)
    )
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def plot_triton(path: Path, rows: Sequence[dict[str, Any]], title: str) -> None:
    """Grouped bars per items/request: items/s and p99, batching off vs on, with speed-ups."""
    import numpy as np

    plt = _pyplot()
    sizes = sorted({r["items_per_request"] for r in rows})
    by = {(r["items_per_request"], r["batching"]): r for r in rows}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    pos = np.arange(len(sizes))
    width = 0.38
    for offset, setting, color in ((-width / 2, "off", "#7f7f7f"), (width / 2, "on", _OK)):
        rates = [by.get((n, setting), {}).get("items_per_s", 0.0) for n in sizes]
        p99 = [_nan(by.get((n, setting), {}).get("p99_ms")) for n in sizes]
        top.bar(pos + offset, rates, width, color=color, label=f"batching {setting}")
        bottom.bar(pos + offset, p99, width, color=color, label=f"batching {setting}")
    for i, n in enumerate(sizes):
        off, on = by.get((n, "off")), by.get((n, "on"))
        if off and on and off["items_per_s"] > 0:
            speedup = on["items_per_s"] / off["items_per_s"]
            top.annotate(
                f"x{speedup:.2f}",
                (i + width / 2, on["items_per_s"]),
                textcoords="offset points",
                xytext=(0, 3),
                ha="center",
                fontsize=9,
            )
    top.set_ylabel("throughput (items/s)")
    top.set_title(title)
    top.legend(fontsize=9, loc="upper left", ncol=2)
    top.grid(alpha=0.3, axis="y")
    top.set_ylim(0, max([r["items_per_s"] for r in rows] + [1e-9]) * 1.3)
    p99s = [r["p99_ms"] for r in rows if r.get("p99_ms")]
    if p99s and max(p99s) / min(p99s) > 20:
        bottom.set_yscale("log")
        _plain_log_axis(bottom)
    bottom.set_ylabel("p99 latency (ms)")
    bottom.set_xlabel("items per request")
    bottom.set_xticks(pos, [str(n) for n in sizes])
    bottom.legend(fontsize=9)
    bottom.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    _save(fig, path)


def plot_tune(
    path: Path,
    configs: Sequence[dict[str, Any]],
    goal_ms: float,
    best: str | None,
    chosen_point: dict[str, Any] | None = None,
) -> None:
    """Throughput against p99 for each setting tried (one line through its concurrencies).

    ``chosen_point`` (the recommendation's run, perhaps a confirming one) gets the star.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 6))
    cmap = plt.get_cmap("tab20")
    for k, config in enumerate(configs):
        points = [p for p in config["points"] if p["p99_ms"] is not None]
        if not points:
            continue
        chosen = config["name"] == best
        ax.plot(
            [p["p99_ms"] for p in points],
            [p["items_per_s"] for p in points],
            "o-",
            color="black" if chosen else cmap(k % 20),
            lw=2.5 if chosen else 1,
            ms=4,
            alpha=1 if chosen else 0.75,
            label=("recommended: " if chosen else "") + config["name"],
        )
        bp = chosen_point or config.get("best_point")
        if chosen and bp:
            ax.plot([bp["p99_ms"]], [bp["items_per_s"]], "*", color="gold", ms=18, mec="black")
            ax.annotate(
                f"recommended: {bp['items_per_s']:.0f} items/s at {bp['concurrency']} clients",
                (bp["p99_ms"], bp["items_per_s"]),
                textcoords="offset points",
                xytext=(12, -22),
                fontsize=9,
                bbox={"boxstyle": "round", "fc": "white", "alpha": 0.9},
            )
    ax.axvline(goal_ms, color=_FAIL, ls="--", label=f"goal p99 <= {goal_ms:g} ms")
    ax.axvspan(
        goal_ms,
        ax.get_xlim()[1] if ax.get_xlim()[1] > goal_ms else goal_ms * 2,
        color=_FAIL,
        alpha=0.06,
    )
    ax.set_xscale("log")
    _plain_log_axis(ax, "x")
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("throughput (items/s)")
    ax.set_title("tune: throughput vs p99 per setting (points = concurrency 1, 2, 4, ...)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    _save(fig, path)
