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
    "plain_log_axis",
    "plot_triton",
    "plot_tune",
    "rolling_median",
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
        log_x = high / low > 20
        if log_x:
            bins = np.geomspace(low, high * 1.001, 60)
            hist_ax.set_xscale("log")
        else:
            bins = np.linspace(values[0], values[-1] + 1e-9, 60)
        counts, _, _ = hist_ax.hist(values, bins=bins, color=_OK, alpha=0.8)
        if log_x:
            plain_log_axis(hist_ax, "x", [low, high], length_in=3.8)
        for name, value, color in marks:
            if value is not None:
                hist_ax.axvline(value, color=color, ls="--", label=f"{name} {_ms(value)}")
        hist_ax.set_xlabel("latency (ms)")
        hist_ax.set_ylabel("requests")
        hist_ax.set_title("latency distribution (200 answers)")
        # Headroom above the tallest bar, where the legend goes.
        hist_ax.set_ylim(0, max(float(counts.max()), 1.0) * 1.35)
        hist_ax.legend(loc="upper center", ncol=3, fontsize=8, framealpha=0.9)

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
                # Right of and below its point: under the rising curve, inside the axes.
                pct_ax.annotate(
                    _ms(value),
                    (_nines_x(q), value),
                    textcoords="offset points",
                    xytext=(7, -3),
                    ha="left",
                    va="top",
                    fontsize=9,
                    color=color,
                    bbox=_LABEL_BOX,
                )
        pct_ax.set_ylim(0, float(values[-1]) * 1.08)
        pct_ax.set_xlabel("percentile (axis spaced by nines)")
        pct_ax.set_ylabel("latency (ms)")
        pct_ax.set_title("latency by percentile")
        pct_ax.grid(alpha=0.3)
    _batch_panel(batch_ax, doc.get("server_batches"))
    fig.tight_layout()
    _save(fig, path)


def plot_timeline(path: Path, doc: dict[str, Any]) -> None:
    """Answers/s (and offered/s, failures/s) and p50/p99 over the run.

    Each window's own values are drawn thin and faint; the thick lines are their rolling
    median over about 2 s, the trend a reader looks for (a window of a quarter second holds
    few requests, and its p99 jumps with each batch). A last window cut short by the end of
    the run is left out: its few answers over a short time make a spike that did not happen.
    """
    plt = _pyplot()
    window = doc["timeline_window_s"]
    rows = list(doc["timeline"])
    if len(rows) > 1 and rows[-1]["length_s"] < window / 2:
        rows = rows[:-1]
    k = _smoothing(window, len(rows))
    smooth_s = k * window
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    t = [r["t_s"] + r["length_s"] / 2 for r in rows]

    def trend(ax: Axes, values: list[float], color: str, label: str, **style: Any) -> None:
        if k > 1:
            ax.plot(t, values, color=color, lw=0.8, alpha=0.3, **style)
            ax.plot(t, rolling_median(values, k), color=color, lw=2, label=label, **style)
        else:
            ax.plot(t, values, color=color, lw=1.5, label=label, **style)

    trend(top, [r["ok_per_s"] for r in rows], _OK, "answered 200 /s")
    if doc["load"]["mode"] == "open":
        offered = [float(r["offered_per_s"]) for r in rows]
        # Nothing is offered after the last scheduled send: no line, rather than a drop to 0.
        sent = max((i for i, v in enumerate(offered) if v > 0), default=-1)
        offered = [v if i <= sent else math.nan for i, v in enumerate(offered)]
        trend(top, offered, "grey", "offered /s", ls="--")
    failed = [r["failed"] / r["length_s"] for r in rows]
    if any(failed):
        top.bar(t, failed, width=window * 0.9, color=_FAIL, alpha=0.5, label="failed /s")
    top.set_ylim(bottom=0)
    top.set_ylabel("requests / s")
    top.legend(loc="best", fontsize=9, framealpha=0.9)
    top.grid(alpha=0.3)
    how = f"rolling median of {smooth_s:g} s" if k > 1 else f"{window:g} s windows"
    top.set_title(f"{doc['label'] or 'run'}: over time ({how}; faint: each {window:g} s window)")
    p50 = [math.nan if r["p50_ms"] is None else r["p50_ms"] for r in rows]
    p99 = [math.nan if r["p99_ms"] is None else r["p99_ms"] for r in rows]
    trend(bottom, p50, _P50, "p50")
    trend(bottom, p99, _P99, "p99")
    finite = [v for v in p50 + p99 if not math.isnan(v) and v > 0]
    if finite and max(finite) / min(finite) > 30:
        bottom.set_yscale("log")
        plain_log_axis(bottom, "y", finite, length_in=2.6)
    else:
        bottom.set_ylim(bottom=0)
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("seconds since start")
    bottom.legend(loc="upper left", fontsize=9, framealpha=0.9)
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
        top.plot(x, x, ":", color="grey", label="offered requests/s")
    for p in points:
        stacked = 8
        if p.get("mean_batch") is not None:
            top.annotate(
                f"batch {p['mean_batch']:.1f}",
                (p["x"], p["items_per_s"]),
                textcoords="offset points",
                xytext=(0, stacked),
                ha="center",
                fontsize=8,
                color="#9467bd",
                bbox=_LABEL_BOX,
            )
            if p["items_per_s"] == p["requests_per_s"]:
                stacked += 12
        if p.get("error_rate"):
            top.annotate(
                f"{p['error_rate']:.0%} failed",
                (p["x"], p["requests_per_s"]),
                textcoords="offset points",
                xytext=(0, stacked),
                ha="center",
                fontsize=8,
                color=_FAIL,
                bbox=_LABEL_BOX,
            )
    top.set_ylabel("throughput (per second)")
    top.set_title(title)
    top.legend(loc="upper left", fontsize=9, framealpha=0.9)
    top.grid(alpha=0.3)
    # Every line stays on the chart, the offered rate too, with room for the labels above.
    highest = [p["items_per_s"] for p in points] + [p["requests_per_s"] for p in points]
    if offered_line:
        highest += [float(v) for v in x]
    top.set_ylim(0, max(max(highest), 1e-9) * 1.25)
    bottom.plot(x, [_nan(p["p50_ms"]) for p in points], "o-", color=_P50, label="p50")
    bottom.plot(x, [_nan(p["p99_ms"]) for p in points], "o-", color=_P99, label="p99")
    if goal_ms is not None:
        bottom.axhline(goal_ms, color="black", ls="--", lw=1, label=f"goal {goal_ms:g} ms")
    shown = [v for p in points for v in (p["p50_ms"], p["p99_ms"]) if v]
    if shown and max(shown) / min(shown) > 10:
        bottom.set_yscale("log")
        plain_log_axis(bottom, "y", shown + ([goal_ms] if goal_ms else []), length_in=2.8)
    else:
        bottom.set_ylim(bottom=0)
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel(x_label)
    bottom.legend(loc="upper left", fontsize=9, framealpha=0.9)
    bottom.grid(alpha=0.3, which="major")
    if log2_x:
        bottom.set_xscale("log", base=2)
        bottom.set_xticks(x, [f"{v:g}" for v in x])
        bottom.xaxis.set_minor_formatter(_null_formatter())
    fig.tight_layout()
    _save(fig, path)


def _null_formatter() -> Any:
    from matplotlib.ticker import NullFormatter

    return NullFormatter()


def plain_log_axis(
    ax: Axes, which: str = "y", values: Sequence[float] | None = None, length_in: float = 4.0
) -> None:
    """A log-scaled axis labelled with plain numbers (20, 50, 100, not 2x10^1), and only as
    many labels as fit: how many per decade depends on the decades the data spans (``values``,
    else the axis's current limits) and on the axis's length in inches, so they never crowd."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis = ax.yaxis if which == "y" else ax.xaxis
    finite = [v for v in values or () if v is not None and v > 0 and math.isfinite(v)]
    if finite:
        low, high = min(finite), max(finite)
    else:
        low, high = ax.get_ylim() if which == "y" else ax.get_xlim()
    decades = max(math.log10(high / low), 0.3) if low > 0 and high > low else 3.0
    # About one label per 0.45 inch (a y axis) or 0.7 inch (an x axis, whose labels are wide).
    room = max(2, int(length_in / (0.45 if which == "y" else 0.7)))
    per_decade = room / decades
    subs: tuple[float, ...]
    if per_decade >= 5:
        subs = (1.0, 2.0, 3.0, 5.0, 7.0)
    elif per_decade >= 3:
        subs = (1.0, 2.0, 5.0)
    elif per_decade >= 2:
        subs = (1.0, 3.0)
    else:
        subs = (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=room + 2))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _plain(v)))
    axis.set_minor_formatter(NullFormatter())


def _plain(value: float) -> str:
    """A tick value as people write it: 0.5, 20, 300, 5000, 20000."""
    if value >= 1:
        return f"{value:,.0f}".replace(",", "")
    return f"{value:g}"


def _ms(value: float) -> str:
    """A latency for a label: 3.2 ms, 87 ms, 4.8 s."""
    if value >= 1000:
        return f"{value / 1000:.3g} s"
    return f"{value:.2g} ms" if value < 10 else f"{value:.0f} ms"


def rolling_median(values: Sequence[float], k: int) -> list[float]:
    """The median of each value's centred neighbourhood of ``k`` values (NaN ignored): the
    trend of a noisy per-window series without its saw-tooth."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    half = k // 2
    out: list[float] = []
    for i in range(data.size):
        part = data[max(0, i - half) : i + half + 1]
        part = part[~np.isnan(part)]
        out.append(float(np.median(part)) if part.size else math.nan)
    return out


def _smoothing(window: float, windows: int) -> int:
    """How many windows to take the rolling median over: about 2 s (at least 3 windows), none
    when the run has too few windows to show a trend."""
    k = max(3, round(2.0 / window))
    return k if windows >= 2 * k else 1


_LABEL_BOX = {"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8}


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
        plain_log_axis(bottom, "y", p99s, length_in=2.8)
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

    ``chosen_point`` (the recommendation's run, perhaps a confirming one) gets the star. The
    legend goes under the chart, in columns, so that the chart keeps its width however many
    settings were tried; the recommended one is drawn last, on top, in black.
    """
    plt = _pyplot()
    shown = [c for c in configs if any(p["p99_ms"] is not None for p in c["points"])]
    columns = 3
    rows = math.ceil((len(shown) + 1) / columns)
    fig, ax = plt.subplots(figsize=(11, 6 + 0.22 * rows))
    cmap = plt.get_cmap("tab20")
    chosen_config = None
    for k, config in enumerate(shown):
        points = [p for p in config["points"] if p["p99_ms"] is not None]
        if config["name"] == best:
            chosen_config = (config, points)
            continue
        ax.plot(
            [p["p99_ms"] for p in points],
            [p["items_per_s"] for p in points],
            "o-",
            color=cmap(k % 20),
            lw=1,
            ms=3.5,
            alpha=0.7,
            label=_setting_label(config),
        )
    values = [p["p99_ms"] for c in shown for p in c["points"] if p["p99_ms"] is not None]
    if chosen_config is not None:
        config, points = chosen_config
        ax.plot(
            [p["p99_ms"] for p in points],
            [p["items_per_s"] for p in points],
            "o-",
            color="black",
            lw=2.5,
            ms=4,
            label="recommended: " + _setting_label(config),
            zorder=5,
        )
    ax.axvline(goal_ms, color=_FAIL, ls="--", label=f"goal: p99 <= {goal_ms:g} ms")
    high = max([*values, goal_ms]) * 1.5
    ax.axvspan(goal_ms, high, color=_FAIL, alpha=0.06)
    ax.set_xscale("log")
    ax.set_xlim(min([*values, goal_ms]) / 1.3, high)
    plain_log_axis(ax, "x", [*values, goal_ms], length_in=9.0)
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("throughput (items/s)")
    ax.set_title("tune: throughput vs p99 per setting (points: 1, 2, 4, ... clients)")
    ax.set_ylim(
        bottom=0, top=max([p["items_per_s"] for c in shown for p in c["points"]] + [1]) * 1.15
    )
    ax.grid(alpha=0.3, which="major")
    bp = chosen_point or (chosen_config[0].get("best_point") if chosen_config else None)
    if chosen_config is not None and bp:
        ax.plot(
            [bp["p99_ms"]], [bp["items_per_s"]], "*", color="gold", ms=18, mec="black", zorder=6
        )
        # The label goes toward the middle of the chart, so it is never cut at an edge.
        x_frac = ax.transAxes.inverted().transform(ax.transData.transform((bp["p99_ms"], 0)))[0]
        right = x_frac < 0.6
        ax.annotate(
            f"recommended: {bp['items_per_s']:.0f} items/s\nat {bp['concurrency']} clients, "
            f"p99 {_ms(bp['p99_ms'])}",
            (bp["p99_ms"], bp["items_per_s"]),
            textcoords="offset points",
            xytext=(14 if right else -14, -16),
            ha="left" if right else "right",
            va="top",
            fontsize=9,
            bbox={"boxstyle": "round", "fc": "white", "alpha": 0.9},
            zorder=7,
        )
    ax.legend(
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.1),
        ncol=columns,
        frameon=False,
    )
    fig.tight_layout()
    _save(fig, path)


def _setting_label(config: dict[str, Any]) -> str:
    """A setting as a short legend entry: ``batch 32, delay 2 ms, 2 instances``."""
    setting = config.get("setting") or {}
    try:
        instances = int(setting["instances"])
        return (
            f"batch {setting['max_batch_size']}, delay {setting['max_queue_delay_ms']:g} ms, "
            f"{instances} instance{'s' if instances != 1 else ''}"
        )
    except (KeyError, TypeError, ValueError):
        return str(config["name"])
