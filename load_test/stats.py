"""Statistics of a run: percentiles, throughput, outcomes, phases, timeline, self-checks.

Pure functions of recorded columns; the clock readings are seconds on one monotonic clock.
Percentiles are nearest-rank (the value of an actual request, never an interpolation), which
is numpy's ``method="inverted_cdf"``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "OutcomeCounts",
    "Columns",
    "Findings",
    "self_check",
    "latency_summary",
    "lag_limit",
    "outcome_counts",
    "percentile",
    "phase_summaries",
    "summarize",
    "timeline",
]

# Pseudo status codes for requests that got no usable HTTP answer.
CONNECTION_ERROR = -1
TIMEOUT = -2
INVALID = -3

#: Client CPU share of one core above which the tool is presumed to be the bottleneck.
CPU_LIMIT = 0.9
#: Cores' worth of CPU used by neither tool nor server above which the run was disturbed.
OTHER_CORES_LIMIT = 0.25


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank ``q``-th percentile (0-100) of already sorted values; NaN when empty."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    # The small slack keeps q*n/100 that should be whole (99.9 * 1000 / 100) from rounding
    # up to the next rank through floating-point error.
    rank = math.ceil(q * n / 100 - 1e-9)
    return sorted_values[min(max(rank, 1), n) - 1]


def latency_summary(values_s: Sequence[float]) -> dict[str, float | int | None]:
    """Count, mean, min, p50, p90, p99, p99.9 and max, in milliseconds (None when empty)."""
    ordered = sorted(values_s)
    n = len(ordered)

    def ms(value: float) -> float | None:
        return None if math.isnan(value) else round(value * 1000, 3)

    return {
        "count": n,
        "mean_ms": ms(sum(ordered) / n) if n else None,
        "min_ms": ms(ordered[0]) if n else None,
        "p50_ms": ms(percentile(ordered, 50)),
        "p90_ms": ms(percentile(ordered, 90)),
        "p99_ms": ms(percentile(ordered, 99)),
        "p99.9_ms": ms(percentile(ordered, 99.9)),
        "max_ms": ms(ordered[-1]) if n else None,
    }


@dataclass(frozen=True, slots=True)
class OutcomeCounts:
    """Requests by how they ended; every request is in exactly one of the first seven."""

    ok: int
    overloaded_503: int
    deadline_504: int
    other_http: dict[str, int]
    connection_errors: int
    timeouts: int
    invalid: int
    error_kinds: dict[str, int]

    @property
    def total(self) -> int:
        return (
            self.ok
            + self.overloaded_503
            + self.deadline_504
            + sum(self.other_http.values())
            + self.connection_errors
            + self.timeouts
            + self.invalid
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "200": self.ok,
            "503": self.overloaded_503,
            "504": self.deadline_504,
            "other_http": self.other_http,
            "connection_errors": self.connection_errors,
            "timeouts": self.timeouts,
            "invalid_responses": self.invalid,
            "error_kinds": self.error_kinds,
        }


def outcome_counts(
    statuses: Sequence[int], errors: Mapping[str, int] | None = None
) -> OutcomeCounts:
    """Classify status codes (and the pseudo codes for failures) into outcomes."""
    counts = Counter(statuses)
    other = {
        str(code): n
        for code, n in sorted(counts.items())
        if code >= 100 and code not in (200, 503, 504)
    }
    return OutcomeCounts(
        ok=counts[200],
        overloaded_503=counts[503],
        deadline_504=counts[504],
        other_http=other,
        connection_errors=counts[CONNECTION_ERROR],
        timeouts=counts[TIMEOUT],
        invalid=counts[INVALID],
        error_kinds=dict(sorted((errors or {}).items())),
    )


@dataclass(frozen=True, slots=True)
class Columns:
    """The recorded columns a summary needs (a :class:`load_test.client.Recorder` fits)."""

    intended: Sequence[float]
    dispatched: Sequence[float]
    sent: Sequence[float]
    done: Sequence[float]
    status: Sequence[int]
    items: Sequence[int]
    phase: Sequence[int]


def _ok_latencies(cols: Columns, indices: Sequence[int] | range) -> list[float]:
    return [cols.done[i] - cols.intended[i] for i in indices if cols.status[i] == 200]


def summarize(
    cols: Columns, start: float, errors: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Throughput, latency and outcomes of a run that began at ``start``.

    Latency is over 200 answers only, from the intended send time; failures are counted, not
    timed, because a fast 503 would otherwise flatter the percentiles. Throughput counts 200
    answers (and their items) per second from ``start`` to the last answer.
    """
    n = len(cols.status)
    every = range(n)
    last = max(cols.done) if n else start
    span = max(last - start, 1e-9)
    ok_items = sum(cols.items[i] for i in every if cols.status[i] == 200)
    outcomes = outcome_counts(cols.status, errors)
    service = [cols.done[i] - cols.sent[i] for i in every if cols.status[i] == 200]
    return {
        "requests": n,
        "items": sum(cols.items),
        "ok_requests": outcomes.ok,
        "ok_items": ok_items,
        "duration_s": round(span, 4),
        "throughput": {
            "requests_per_s": round(outcomes.ok / span, 3) if n else 0.0,
            "items_per_s": round(ok_items / span, 3) if n else 0.0,
            "attempted_requests_per_s": round(n / span, 3) if n else 0.0,
        },
        "latency": latency_summary(_ok_latencies(cols, every)),
        "service_time": latency_summary(service),
        "outcomes": outcomes.as_dict(),
        "error_rate": round(1 - outcomes.ok / n, 6) if n else 0.0,
    }


def phase_summaries(
    cols: Columns, start: float, phases: Sequence[tuple[float, float, float]]
) -> list[dict[str, Any]]:
    """Per open-loop phase ``(rate, start offset, duration)``: offered vs achieved.

    A phase's latency covers the requests scheduled in it; its throughput counts the answers
    that arrived while it lasted, which is what the server kept up with at that rate.
    """
    result = []
    for index, (rate, offset, duration) in enumerate(phases):
        begin, end = start + offset, start + offset + duration
        members = [i for i, p in enumerate(cols.phase) if p == index]
        in_window = [
            i for i, t in enumerate(cols.done) if begin <= t < end and cols.status[i] == 200
        ]
        outcomes = outcome_counts([cols.status[i] for i in members])
        result.append(
            {
                "phase": index,
                "offered_rate": rate,
                "start_s": round(offset, 4),
                "duration_s": round(duration, 4),
                "requests": len(members),
                "throughput": {
                    "requests_per_s": round(len(in_window) / duration, 3),
                    "items_per_s": round(sum(cols.items[i] for i in in_window) / duration, 3),
                },
                "latency": latency_summary(_ok_latencies(cols, members)),
                "outcomes": outcomes.as_dict(),
            }
        )
    return result


def timeline(cols: Columns, start: float, window: float) -> list[dict[str, Any]]:
    """Per ``window`` seconds: answers/s, items/s, failures, offered/s and latency of answers."""
    if not cols.status:
        return []
    last = max(max(cols.done), max(cols.intended))
    count = max(1, math.ceil((last - start) / window))
    done_in: list[list[int]] = [[] for _ in range(count)]
    offered = [0] * count
    for i, t in enumerate(cols.done):
        done_in[min(int((t - start) / window), count - 1)].append(i)
    for t in cols.intended:
        offered[min(max(int((t - start) / window), 0), count - 1)] += 1
    rows = []
    for k, members in enumerate(done_in):
        ok = [i for i in members if cols.status[i] == 200]
        latencies = sorted(cols.done[i] - cols.intended[i] for i in ok)
        # The last window is cut short by the end of the run: rates use the time it covered.
        length = max(min(window, last - start - k * window), window / 20)
        rows.append(
            {
                "t_s": round(k * window, 4),
                "length_s": round(length, 4),
                "ok_per_s": round(len(ok) / length, 3),
                "items_per_s": round(sum(cols.items[i] for i in ok) / length, 3),
                "failed": len(members) - len(ok),
                "offered_per_s": round(offered[k] / length, 3),
                "p50_ms": _ms_or_none(percentile(latencies, 50)),
                "p99_ms": _ms_or_none(percentile(latencies, 99)),
            }
        )
    return rows


def _ms_or_none(value: float) -> float | None:
    return None if math.isnan(value) else round(value * 1000, 3)


def _cause(cpu_fraction: float, machine_busy: float | None) -> str:
    if cpu_fraction >= CPU_LIMIT:
        return ""  # the CPU warning already names the cause
    if cpu_fraction < 0.5:
        busy = "" if machine_busy is None else f", the machine's {machine_busy:.0%}"
        return (
            f" (the tool used {cpu_fraction:.0%} of a core{busy}: it was waiting for a CPU "
            "that the server, sharing these cores, or other programs held; a client on "
            "another machine, or the server pinned to fewer cores, would not be late)"
        )
    return ""


def lag_limit(mean_gap_s: float) -> float:
    """Send lag tolerated in open loop: 10% of the mean gap, clamped to 2..5 ms.

    Below 2 ms the event loop's timer granularity (1 ms epoll timeouts) alone would trip it;
    above 5 ms a late request is late whatever the rate.
    """
    return min(0.005, max(0.002, 0.1 * mean_gap_s))


@dataclass(frozen=True, slots=True)
class Findings:
    """What the tool's checks on itself found: ``warnings`` make a number untrustworthy;
    ``notes`` are deviations too small, beside the latency measured, to change it."""

    warnings: list[str]
    notes: list[str]


#: A lag this small a share of the p99 latency it is part of cannot move the result.
MATERIAL_SHARE = 0.05


def self_check(
    *,
    mode: str,
    cpu_fraction: float,
    send_lag_p99_s: float | None = None,
    mean_gap_s: float | None = None,
    connection_wait_p99_s: float | None = None,
    connections_full: bool = False,
    loop_lag_p99_s: float | None = None,
    offered_per_s: float | None = None,
    achieved_per_s: float | None = None,
    error_rate: float = 0.0,
    machine_busy: float | None = None,
    other_cores: float | None = None,
    latency_p99_s: float | None = None,
) -> Findings:
    """Reasons not to trust a run's numbers as a description of the server.

    ``other_cores`` is the CPU, in cores, that neither the tool nor the server used while
    the machine ran the test: other programs competing with the server.
    """
    warnings: list[str] = []
    notes: list[str] = []

    def lag(message: str, value: float) -> None:
        # The tool's lateness is part of every latency it reports; it matters only when it is
        # a visible share of them.
        if latency_p99_s and value <= MATERIAL_SHARE * latency_p99_s:
            notes.append(
                f"{message}; at {value / latency_p99_s:.1%} of the p99 latency "
                f"({latency_p99_s * 1000:.1f} ms) it does not change the result"
            )
        else:
            warnings.append(message + _cause(cpu_fraction, machine_busy))

    if other_cores is not None and other_cores >= OTHER_CORES_LIMIT:
        warnings.append(
            f"other processes used {other_cores:.2f} CPU cores during the run: the server "
            "shared the machine with them, so its numbers are lower than it can do alone"
        )
    if cpu_fraction >= CPU_LIMIT:
        warnings.append(
            f"the load generator used {cpu_fraction:.0%} of a CPU core: it is likely the "
            "bottleneck, so throughput and latency describe the client, not the server"
        )
    if mode == "open" and send_lag_p99_s is not None and mean_gap_s is not None:
        limit = lag_limit(mean_gap_s)
        if send_lag_p99_s > limit:
            lag(
                f"send lag p99 {send_lag_p99_s * 1000:.1f} ms exceeds {limit * 1000:.1f} ms "
                f"(mean gap {mean_gap_s * 1000:.2f} ms): the tool did not keep its schedule, "
                "so latencies include its lateness and arrivals came bunched",
                send_lag_p99_s,
            )
    if mode == "open" and connections_full and connection_wait_p99_s:
        warnings.append(
            f"every connection was busy; requests waited up to p99 "
            f"{connection_wait_p99_s * 1000:.1f} ms for one (counted in latency, as a real "
            "client would see it); raise --max-connections to offer the full rate"
        )
    if mode == "closed" and loop_lag_p99_s is not None and loop_lag_p99_s > 0.01:
        lag(
            f"the tool's event loop ran p99 {loop_lag_p99_s * 1000:.1f} ms late, so "
            "latencies include the client's own delay",
            loop_lag_p99_s,
        )
    if offered_per_s and achieved_per_s is not None and achieved_per_s < 0.9 * offered_per_s:
        warnings.append(
            f"the server answered {achieved_per_s:.1f} requests/s with 200 of "
            f"{offered_per_s:.1f}/s offered: it is saturated or shedding load, and a "
            "saturated server's latency grows with the length of the run"
        )
    if error_rate >= 0.5:
        warnings.append(f"{error_rate:.0%} of requests failed")
    return Findings(warnings, notes)
