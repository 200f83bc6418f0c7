"""The choice of engine and precision, from measurements: a pure function of numbers.

No ML library is imported here, so tests hand :func:`decide` whatever measurements they like
and the decision is the same on any CPU.

The rule:

- only variants that were built, passed the accuracy check against torch fp32 and were timed
  take part; torch fp32 (the reference) always does;
- at each measured batch size the fastest wins, where another variant must beat torch fp32 by
  :data:`REFERENCE_MARGIN` to displace it (start-up timing is noisy, and torch fp32 is what
  the model was made with);
- when one variant wins at every size, or the winner at the smallest size is within
  :data:`SECOND_ENGINE_GAIN` of the winner at the largest there (and vice versa), one variant
  serves every batch;
- otherwise two are kept, split at the batch size where their (fixed + per-item) cost lines
  cross, provided the second one adds at most :data:`SECOND_ENGINE_MAX_MB` of memory; if it
  costs more, the variant whose worst size is closest to the best is kept alone.

The rates are those at the lengths traffic has (:mod:`.lengths`), timed interleaved
(:mod:`.interleave`). A decision whose timings other processes disturbed by more than its
margin allows (``Decision.disturbed``), or one made before the variants were timed
(``Decision.provisional``: the first start serves a safe variant at once), is ``busy``: it
serves, and :class:`RetakeRule` says when to measure again (once the server has been idle a
while on a quiet machine), until a settled measurement replaces it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BUSY_CORES",
    "REFERENCE",
    "REFERENCE_MARGIN",
    "SECOND_ENGINE_GAIN",
    "SECOND_ENGINE_MAX_MB",
    "Decision",
    "Measurement",
    "RetakeRule",
    "Route",
    "decide",
    "others_cores",
    "variant_name",
]

#: The variant every other is checked against.
REFERENCE = "torch-fp32"
#: Another variant must be this much faster than torch fp32 to displace it (1.05: 5 %).
REFERENCE_MARGIN = 1.05
#: A second variant is kept only when it is this much faster at its batch sizes (1.10: 10 %).
SECOND_ENGINE_GAIN = 1.10
#: ... and adds at most this much resident memory.
SECOND_ENGINE_MAX_MB = 512.0
#: Other processes that used this many cores on average while the variants were timed make
#: the measurements busy: retaken once the server has been idle.
BUSY_CORES = 0.25


def others_cores(machine_busy_s: float, own_s: float, wall_s: float) -> float:
    """The cores other processes used on average during a timing of ``wall_s`` seconds: the
    CPU time the whole machine spent busy less the measuring process's own."""
    if wall_s <= 0:
        return 0.0
    return max(0.0, machine_busy_s - own_s) / wall_s


def variant_name(engine: str, precision: str) -> str:
    return f"{engine}-{precision}"


@dataclass(frozen=True, slots=True)
class Measurement:
    """What was learned about one (engine, precision) variant at start-up.

    :param items_per_s: batch size -> items per second at that size (median of the runs).
    :param accuracy: the accuracy figure against torch fp32 (min cosine, max score gap, share
        of identical top-k), with ``accuracy_ok`` whether it passed.
    :param memory_mb: resident memory the variant added when it was built and run.
    :param error: why the variant cannot serve (not installed, export failed, check failed,
        ...); None when it can.
    """

    engine: str
    precision: str
    items_per_s: Mapping[int, float] = field(default_factory=dict)
    accuracy: float | None = None
    accuracy_ok: bool = True
    accuracy_text: str = ""
    memory_mb: float | None = None
    error: str | None = None
    #: tokens -> batch size -> items per second, at each length timed (:mod:`.lengths`).
    by_length: Mapping[int, Mapping[int, float]] = field(default_factory=dict)
    #: The cores other processes used while this variant was timed (None: not known).
    busy_cores: float | None = None

    @property
    def name(self) -> str:
        return variant_name(self.engine, self.precision)

    @property
    def usable(self) -> bool:
        return self.error is None and self.accuracy_ok and bool(self.items_per_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "precision": self.precision,
            "items_per_s": {str(size): round(rate, 1) for size, rate in self.items_per_s.items()},
            "accuracy": self.accuracy,
            "accuracy_ok": self.accuracy_ok,
            "accuracy_text": self.accuracy_text,
            "memory_mb": None if self.memory_mb is None else round(self.memory_mb, 1),
            "error": self.error,
            "items_per_s_by_tokens": {
                str(tokens): {str(size): round(rate, 1) for size, rate in rates.items()}
                for tokens, rates in self.by_length.items()
            },
            "busy_cores": None if self.busy_cores is None else round(self.busy_cores, 3),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measurement:
        return cls(
            engine=str(data["engine"]),
            precision=str(data["precision"]),
            items_per_s={int(size): float(rate) for size, rate in data["items_per_s"].items()},
            accuracy=None if data.get("accuracy") is None else float(data["accuracy"]),
            accuracy_ok=bool(data.get("accuracy_ok", True)),
            accuracy_text=str(data.get("accuracy_text", "")),
            memory_mb=None if data.get("memory_mb") is None else float(data["memory_mb"]),
            error=None if data.get("error") is None else str(data["error"]),
            by_length={
                int(tokens): {int(size): float(rate) for size, rate in rates.items()}
                for tokens, rates in data.get("items_per_s_by_tokens", {}).items()
            },
            busy_cores=None if data.get("busy_cores") is None else float(data["busy_cores"]),
        )


@dataclass(frozen=True, slots=True)
class Route:
    """Batches of ``first`` to ``last`` items run on ``engine`` at ``precision``."""

    engine: str
    precision: str
    first: int
    last: int

    @property
    def name(self) -> str:
        return variant_name(self.engine, self.precision)

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "precision": self.precision,
            "batch_sizes": [self.first, self.last],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Route:
        first, last = data["batch_sizes"]
        return cls(str(data["engine"]), str(data["precision"]), int(first), int(last))


@dataclass(frozen=True, slots=True)
class Decision:
    """Which variant serves which batch sizes, and why."""

    routes: tuple[Route, ...]
    reason: str
    measurements: tuple[Measurement, ...] = ()
    #: The cores other processes used while the variants were timed (None: not known).
    busy_cores: float | None = None
    #: Whether that disturbance exceeded what the winners' margins allow (None: not judged,
    #: a decision of an older cache: then :data:`BUSY_CORES` or more is disturbed).
    disturbed: bool | None = None
    #: Chosen before the variants were timed (a first start serving a safe variant at once).
    provisional: bool = False

    @property
    def busy(self) -> bool:
        """Not settled: provisional, or disturbed beyond its margins; to be measured again."""
        if self.provisional:
            return True
        if self.disturbed is not None:
            return self.disturbed
        return self.busy_cores is not None and self.busy_cores >= BUSY_CORES

    @property
    def engine(self) -> str:
        return "+".join(dict.fromkeys(route.engine for route in self.routes))

    @property
    def precision(self) -> str:
        return "+".join(dict.fromkeys(route.precision for route in self.routes))

    def route_for(self, size: int) -> Route:
        for route in self.routes:
            if size <= route.last:
                return route
        return self.routes[-1]

    def describe(self) -> str:
        """The choice as one log line shows it."""
        routes = ", ".join(
            f"{route.engine} {route.precision} for batches of {route.first}-{route.last}"
            for route in self.routes
        )
        return f"{routes} ({self.reason})"

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "precision": self.precision,
            "routes": [route.to_json() for route in self.routes],
            "reason": self.reason,
            "measurements": [measurement.to_json() for measurement in self.measurements],
            "busy_cores": None if self.busy_cores is None else round(self.busy_cores, 3),
            "disturbed": self.disturbed,
            "provisional": self.provisional,
            "busy": self.busy,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Decision:
        return cls(
            routes=tuple(Route.from_json(route) for route in data["routes"]),
            reason=str(data["reason"]),
            measurements=tuple(Measurement.from_json(m) for m in data.get("measurements", [])),
            busy_cores=None if data.get("busy_cores") is None else float(data["busy_cores"]),
            disturbed=None if data.get("disturbed") is None else bool(data["disturbed"]),
            provisional=bool(data.get("provisional", False)),
        )


def _score(measurement: Measurement, size: int) -> float:
    rate = measurement.items_per_s.get(size, 0.0)
    return rate * REFERENCE_MARGIN if measurement.name == REFERENCE else rate


def _winner(usable: Sequence[Measurement], size: int) -> Measurement:
    return max(usable, key=lambda measurement: _score(measurement, size))


def _figures(measurement: Measurement) -> str:
    return "/".join(f"{rate:.0f}" for _, rate in sorted(measurement.items_per_s.items()))


def decide(measurements: Sequence[Measurement], max_batch_size: int) -> Decision:
    """Choose the variant(s) that serve batches of 1 to ``max_batch_size`` items.

    :param measurements: every variant tried, including those that failed (they are kept in
        the decision's record, not chosen).
    :raises ValueError: when no measurement is usable (torch fp32 always should be).
    """
    usable = [m for m in measurements if m.usable]
    if not usable:
        raise ValueError("no engine variant could be measured")
    sizes = sorted(set.intersection(*(set(m.items_per_s) for m in usable)))
    if not sizes:
        raise ValueError("the variants were not measured at a common batch size")
    record = tuple(measurements)
    winners = [_winner(usable, size) for size in sizes]
    small, large = winners[0], winners[-1]
    sizes_text = "/".join(str(size) for size in sizes)

    def alone(chosen: Measurement, why: str) -> Decision:
        route = Route(chosen.engine, chosen.precision, 1, max_batch_size)
        return Decision((route,), why, record)

    if all(winner.name == small.name for winner in winners):
        return alone(small, f"fastest at batch sizes {sizes_text}: {_figures(small)} items/s")
    low, high = sizes[0], sizes[-1]
    if large.items_per_s[low] * SECOND_ENGINE_GAIN >= small.items_per_s[low]:
        return alone(large, f"fastest at batch {high} and within 10 % of the fastest at {low}")
    if small.items_per_s[high] * SECOND_ENGINE_GAIN >= large.items_per_s[high]:
        return alone(small, f"fastest at batch {low} and within 10 % of the fastest at {high}")
    extra = large.memory_mb if large.memory_mb is not None else 0.0
    if extra > SECOND_ENGINE_MAX_MB:
        best = {size: max(m.items_per_s[size] for m in usable) for size in sizes}
        chosen = max(
            (small, large),
            key=lambda m: min(m.items_per_s[size] / best[size] for size in sizes),
        )
        return alone(
            chosen,
            f"a second engine would add {extra:.0f} MB (over {SECOND_ENGINE_MAX_MB:.0f} MB)",
        )
    split = crossing(small, large, low, high)
    routes = (
        Route(small.engine, small.precision, 1, split),
        Route(large.engine, large.precision, split + 1, max_batch_size),
    )
    why = (
        f"{small.name} fastest at batch {low} ({small.items_per_s[low]:.0f} vs "
        f"{large.items_per_s[low]:.0f} items/s), {large.name} at {high} "
        f"({large.items_per_s[high]:.0f} vs {small.items_per_s[high]:.0f}); "
        f"{large.name} adds {extra:.0f} MB"
    )
    return Decision(routes, why, record)


def crossing(small: Measurement, large: Measurement, low: int, high: int) -> int:
    """The largest batch size ``small`` still serves: where the two variants' batch times,
    each a straight line ``fixed + per_item * n`` through its two measurements, cross."""

    def line(m: Measurement) -> tuple[float, float]:
        t_low, t_high = low / m.items_per_s[low], high / m.items_per_s[high]
        per_item = (t_high - t_low) / (high - low)
        return t_low - per_item * low, per_item

    (fixed_s, per_s), (fixed_l, per_l) = line(small), line(large)
    if per_s <= per_l:  # small never falls behind: it would have been kept alone
        return high - 1
    at = (fixed_l - fixed_s) / (per_s - per_l)
    return max(low, min(high - 1, int(at)))


@dataclass(slots=True)
class RetakeRule:
    """When busy measurements are taken again: once the server has run no batch for
    ``idle_s`` seconds (first ``first_idle_s`` after the start) while other processes leave
    the cores quiet, and, after a retake that was busy again, after twice as long each time
    (at most ``last_idle_s``). Pure: the caller says what time it is, when the last batch ran
    and how many cores other processes used lately.
    """

    first_idle_s: float = 60.0
    idle_s: float = 60.0
    last_idle_s: float = 3600.0
    retakes: int = 0

    def due(self, busy: bool, now: float, last_activity: float, others: float) -> bool:
        """Whether to measure again now: the decision is busy, the server has been idle long
        enough, and other processes used under :data:`BUSY_CORES` cores (``others``) lately
        (a retake on a machine still busy would be busy again)."""
        if not busy or others >= BUSY_CORES:
            return False
        wait = self.first_idle_s if self.retakes == 0 else self.idle_s
        return now - last_activity >= wait

    def taken(self, still_busy: bool) -> None:
        """A retake ran; ``still_busy``: it was busy again, so wait longer next time."""
        self.retakes += 1
        if still_busy:
            self.idle_s = min(self.last_idle_s, max(self.idle_s, self.first_idle_s) * 2)
