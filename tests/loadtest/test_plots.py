"""The load tool's plots read at a glance, at the size they are written: log-axis labels never
overlap, the offered-load line stays on the chart, the tune legend leaves the chart its width,
and the timeline shows the trend instead of each window's saw-tooth."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import load_test.report as report
from tests.loadtest.helpers import assert_png


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Each figure a plot function makes, drawn as it is saved, kept open for the test."""
    made: list[Any] = []

    def keep(fig: Any, path: Path) -> None:
        fig.savefig(path, dpi=110, bbox_inches="tight")
        made.append(fig)

    monkeypatch.setattr(report, "_save", keep)
    yield made
    plt = report._pyplot()
    for fig in made:
        plt.close(fig)


def visible_labels(axis: Any, renderer: Any) -> list[Any]:
    low, high = sorted(axis.get_view_interval())
    return [
        tick.label1.get_window_extent(renderer)
        for tick in axis.get_major_ticks()
        if tick.label1.get_visible() and tick.label1.get_text() and low <= tick.get_loc() <= high
    ]


def assert_no_overlap(boxes: list[Any]) -> None:
    for first, second in itertools.pairwise(sorted(boxes, key=lambda box: box.x0)):
        assert not first.overlaps(second), (first, second)


def summary(p50: float, p90: float, p99: float) -> dict[str, Any]:
    return {
        "label": "",
        "summary": {
            "requests": 1000,
            "throughput": {"requests_per_s": 100.0, "items_per_s": 100.0},
            "error_rate": 0.0,
            "latency": {"p50_ms": p50, "p90_ms": p90, "p99_ms": p99},
        },
        "server_batches": None,
    }


@pytest.mark.parametrize("high_ms", [45.0, 900.0, 20_000.0, 2_000_000.0])
def test_log_axis_labels_never_overlap(tmp_path: Path, figures: list[Any], high_ms: float) -> None:
    rng = random.Random(1)
    latencies = sorted(3 * (high_ms / 3) ** rng.random() for _ in range(2000))
    report.plot_latency(tmp_path / "latency.png", latencies, summary(50, 500, 5000))
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    histogram = fig.axes[0]
    labels = visible_labels(histogram.xaxis, renderer)
    assert len(labels) >= 3
    assert_no_overlap(labels)
    assert_png(tmp_path / "latency.png")


def test_the_offered_load_stays_on_the_chart(tmp_path: Path, figures: list[Any]) -> None:
    points = [
        {"x": rate, "requests_per_s": min(rate, 700.0), "items_per_s": min(rate, 700.0) * 3}
        | {"p50_ms": 10.0 * rate / 100, "p99_ms": 20.0 * rate / 100, "error_rate": 0.02}
        for rate in (100.0, 400.0, 800.0, 1600.0, 3200.0)
    ]
    report.plot_curve(
        tmp_path / "rates.png", points, x_label="offered", title="rates", offered_line=True
    )
    (fig,) = figures
    top = fig.axes[0]
    assert top.get_ylim()[1] > 3200  # the offered line's end is on the chart
    # Every "failed" label is inside the axes, none below the x axis.
    renderer = fig.canvas.get_renderer()
    inside = top.get_window_extent(renderer)
    for text in top.texts:
        box = text.get_window_extent(renderer)
        assert box.y0 >= inside.y0 and box.y1 <= inside.y1, text.get_text()


def test_the_tune_legend_leaves_the_chart_its_width(tmp_path: Path, figures: list[Any]) -> None:
    configs = []
    for batch, delay, instances in itertools.product((1, 4, 8, 16, 32, 64), (0, 2), (1, 2)):
        configs.append(
            {
                "name": f"max_batch_size={batch} max_queue_delay={delay}ms instances={instances}",
                "setting": {
                    "max_batch_size": batch,
                    "max_queue_delay_ms": delay,
                    "instances": instances,
                },
                "points": [
                    {"concurrency": c, "p99_ms": 5.0 * c**0.5 + batch / 8, "items_per_s": 100 * c}
                    for c in (1, 2, 4, 8)
                ],
            }
        )
    best = configs[9]["name"]
    report.plot_tune(tmp_path / "tune.png", configs, 40.0, best, configs[9]["points"][-1])
    (fig,) = figures
    chart = fig.axes[0].get_position()
    assert chart.width > 0.8  # the legend is under the chart, not beside it
    assert_png(tmp_path / "tune.png")


def test_the_timeline_shows_the_trend_not_a_saw_tooth(tmp_path: Path, figures: list[Any]) -> None:
    window = 0.25
    rows = []
    for k in range(60):
        spike = 120.0 if k % 4 == 0 else 0.0  # every fourth window holds a batch's wait
        rows.append(
            {
                "t_s": k * window,
                "length_s": window,
                "ok_per_s": 600.0 + (60 if k % 2 else -60),
                "offered_per_s": 600.0 if k < 50 else 0.0,
                "failed": 0,
                "p50_ms": 20.0,
                "p99_ms": 30.0 + spike,
            }
        )
    rows.append(rows[-1] | {"t_s": 60 * window, "length_s": 0.01, "ok_per_s": 5000.0})
    doc = {
        "label": "",
        "timeline": rows,
        "timeline_window_s": window,
        "load": {"mode": "open"},
        "phases": [],
    }
    report.plot_timeline(tmp_path / "timeline.png", doc)
    (fig,) = figures
    top, bottom = fig.axes
    (p99,) = [line for line in bottom.get_lines() if line.get_label() == "p99"]
    values = list(p99.get_ydata())
    # The labelled line is the trend: flat at the typical p99, not jumping 4x every second.
    assert max(values) - min(values) < 20
    (answered,) = [line for line in top.get_lines() if line.get_label() == "answered 200 /s"]
    # The last window, cut short by the end of the run, is not drawn as a 5,000/s spike.
    assert max(answered.get_ydata()) < 700
    assert len(answered.get_xdata()) == 60
    (offered,) = [line for line in top.get_lines() if line.get_label() == "offered /s"]
    # Nothing is offered after the schedule ends: no line dropping to 0.
    assert all(math.isnan(v) or v > 500 for v in offered.get_ydata())
