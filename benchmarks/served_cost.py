"""What a load served by a generating model cost, per output token: the server's CPU (all its
threads, and the event loop's thread alone), the load's client's CPU (this process: on a
shared machine it runs on the same cores), and the server's own account of its decode steps
(``batching_decode_step_seconds`` and ``batching_decode_step_sequences`` from ``/metrics``):
their number, mean time and sequences, and the share of the load's wall time they took.

    before = snapshot(url, pid, model)
    ...  # the load
    figures = cost(before, snapshot(url, pid, model), tokens, seconds)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psutil

from load_test.metrics_scrape import fetch_metrics, parse_histograms

__all__ = ["Snapshot", "cost", "snapshot"]


@dataclass(frozen=True)
class Snapshot:
    """CPU seconds so far of the server's event loop thread and of all its threads, of this
    process, and the server's decode steps so far (count, seconds, sequences)."""

    event_loop_s: float
    server_s: float
    client_s: float
    steps: float
    step_s: float
    step_sequences: float


def _thread_seconds(pid: int) -> tuple[float, float]:
    threads = psutil.Process(pid).threads()
    main = sum(t.user_time + t.system_time for t in threads if t.id == pid)
    return main, sum(t.user_time + t.system_time for t in threads)


def _steps(url: str, model: str) -> tuple[float, float, float]:
    text = fetch_metrics(f"{url}/metrics")
    if text is None:
        return 0.0, 0.0, 0.0
    key = f'model="{model}"'
    times = parse_histograms(text, "batching_decode_step_seconds").get(key)
    sequences = parse_histograms(text, "batching_decode_step_sequences").get(key)
    if times is None or sequences is None:
        return 0.0, 0.0, 0.0
    return times.count, times.sum, sequences.sum


def snapshot(url: str, pid: int, model: str) -> Snapshot:
    """Where the server (process ``pid``, serving ``model`` at ``url``) and this process
    stand now."""
    main, server = _thread_seconds(pid)
    client = sum(psutil.Process().cpu_times()[:2])
    steps, step_s, sequences = _steps(url, model)
    return Snapshot(main, server, client, steps, step_s, sequences)


def cost(before: Snapshot, after: Snapshot, tokens: int, seconds: float) -> dict[str, Any]:
    """The figures of a load that gave ``tokens`` output tokens in ``seconds``, between two
    snapshots."""
    steps = after.steps - before.steps
    step_s = after.step_s - before.step_s

    def per_token(spent: float) -> float:
        return 1e6 * spent / max(tokens, 1)

    return {
        "server_cpu_us_per_token": per_token(after.server_s - before.server_s),
        "event_loop_cpu_us_per_token": per_token(after.event_loop_s - before.event_loop_s),
        "client_cpu_us_per_token": per_token(after.client_s - before.client_s),
        "decode_steps": steps,
        "decode_step_ms": 1000 * step_s / steps if steps else None,
        "sequences_per_step": (after.step_sequences - before.step_sequences) / steps
        if steps
        else None,
        "steps_share_of_wall": step_s / seconds if seconds else None,
    }
