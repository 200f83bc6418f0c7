"""The variants timed side by side at the lengths traffic has, and a decision that other
processes disturbed beyond its margins marked busy; all pure, the clock and load injected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from batching.models.engines.decision import Measurement, decide
from batching.models.engines.decision_table import decision_table
from batching.models.engines.interleave import disturbed, margins, time_interleaved
from batching.models.engines.lengths import (
    TrafficLengths,
    combined_rate,
    shorter,
    timing_lengths,
    weights,
)


def test_variants_are_timed_at_short_long_and_the_median_served_length(tmp_path: Path) -> None:
    assert timing_lengths(256) == (16, 256)
    assert weights((16, 256)) == {16: 0.75, 256: 0.25}  # before any traffic
    seen = TrafficLengths()
    seen.add(30, 40)  # 30 items padded to 40 tokens
    seen.add(10, 200)
    seen.save(tmp_path)
    again = TrafficLengths.load(tmp_path)
    assert again.median() == 40 and timing_lengths(256, again) == (16, 40, 256)
    assert weights((16, 40, 256), again) == {16: 0.0, 40: 0.75, 256: 0.25}
    assert TrafficLengths.load(tmp_path / "absent").items == 0


def test_the_cost_at_traffic_lengths_ranks_what_the_longest_inputs_would_not() -> None:
    # A has a fixed cost per call, B a larger cost per token: B wins on long inputs only.
    a = {16: 300.0, 256: 40.0}
    b = {16: 150.0, 256: 50.0}
    mix = {16: 0.75, 256: 0.25}
    assert combined_rate(a, mix) > combined_rate(b, mix)
    assert combined_rate(a, {256: 1.0}) < combined_rate(b, {256: 1.0})
    assert combined_rate({16: 100.0}, {16: 1.0}) == 100.0


def test_a_batch_is_cut_to_the_length_timed() -> None:
    batch = {"input_ids": np.ones((2, 8), np.int64), "other": "kept"}
    cut = shorter(batch, 3)
    assert cut["input_ids"].shape == (2, 3) and cut["input_ids"].flags.c_contiguous
    assert cut["other"] == "kept" and shorter(batch, 20)["input_ids"].shape == (2, 8)


def test_variants_take_turns_so_load_falls_on_each() -> None:
    order: list[str] = []
    clock = iter(float(t) for t in range(10**6))

    def runner(name: str) -> Any:
        return lambda batch: order.append(name)

    timings = time_interleaved(
        {"a": runner("a"), "b": runner("b")},
        {(1, 16): {}, (32, 16): {}},
        repeats=3,
        budget_s=100.0,
        clock=lambda: next(clock),
        load=lambda: (0.0, 0.0),
    )
    # Per point: one untimed run each, then rounds in alternating order.
    assert order[:8] == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert set(timings.rates["a"]) == {(1, 16), (32, 16)}
    assert timings.others_at(1) == 0.0


def test_other_processes_cpu_time_is_kept_per_point() -> None:
    machine = iter([0.0, 3.0, 3.0, 3.0])  # 3 CPU s of others during the first point only
    clock = iter(float(t) for t in range(10**6))
    timings = time_interleaved(
        {"a": lambda batch: None},
        {(1, 16): {}, (32, 16): {}},
        repeats=1,
        clock=lambda: next(clock),
        load=lambda: (next(machine), 0.0),
    )
    assert timings.others[(1, 16)] > 0 and timings.others[(32, 16)] == 0.0
    assert timings.others_at(32) == 0.0


def test_a_decision_is_disturbed_only_where_the_disturbance_exceeds_its_margin() -> None:
    measured = [
        Measurement("torch", "fp32", {1: 100.0, 32: 100.0}),
        Measurement("onnxruntime", "fp32", {1: 300.0, 32: 104.0}),
    ]
    assert margins(measured)[1] == 2.0
    assert not disturbed(measured, {1: 1.0, 32: 0.1}, cores=2)  # 50 % of the cores < 200 %
    assert disturbed(measured, {1: 0.1, 32: 0.5}, cores=2)  # 25 % > 4 %
    assert not disturbed(measured, {1: 0.2, 32: 0.2}, cores=2)  # quiet


def test_prepare_prints_the_table_it_decided_from() -> None:
    measured = [
        Measurement(
            "onnxruntime",
            "fp32",
            {1: 200.0, 32: 90.0},
            accuracy_text="min cosine 0.999999",
            by_length={16: {1: 400.0, 32: 300.0}, 256: {1: 60.0, 32: 30.0}},
            busy_cores=0.1,
        ),
        Measurement("torch", "bf16", error="failed the accuracy check"),
    ]
    lines = decision_table(decide(measured, 32).to_json())
    assert lines[0].startswith("| variant | tokens | batch 1 items/s | batch 32 items/s |")
    assert "| onnxruntime-fp32 | 16 | 400 | 300 | 0.10 | min cosine 0.999999 | batches 1-32 |" in (
        lines
    )
    assert any("traffic mix | 200 | 90" in line for line in lines)
    assert any(line.startswith("| torch-bf16 | - |") for line in lines)
    assert lines[-1].startswith("chosen: onnxruntime fp32 for batches of 1-32")
