"""The CPU budget of this process, read from the environment it actually runs in.

``os.cpu_count()`` counts the machine's cores, not the ones this process may use: a container
with a CPU quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``) or a narrowed affinity mask
(``taskset``, a cpuset) gets far less, and torch thread teams sized to the machine then wait on
each other at every barrier. The budget is the smaller of the affinity mask and the quota.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuBudget", "read_cpu_budget"]


@dataclass(frozen=True, slots=True)
class CpuBudget:
    """How many cores this process may keep busy, and where that came from."""

    #: Cores in the affinity mask (``os.sched_getaffinity``), else ``os.cpu_count()``.
    affinity: int
    #: Cores the CPU quota allows (quota / period), None when there is no quota.
    quota: float | None
    #: Where the quota was read, for the start-up log.
    quota_source: str | None = None

    @property
    def cores(self) -> int:
        """Whole cores to plan threads for: the affinity mask, capped by the quota (at least 1;
        a fractional quota rounds down, since a thread per partial core would be throttled)."""
        cores = self.affinity
        if self.quota is not None:
            cores = min(cores, max(1, math.floor(self.quota)))
        return max(1, cores)

    def describe(self) -> str:
        quota = "no CPU quota"
        if self.quota is not None:
            quota = f"a quota of {self.quota:g} cores ({self.quota_source})"
        return f"{self.affinity} cores in the affinity mask, {quota}: budget {self.cores}"


def read_cpu_budget(root: Path = Path("/")) -> CpuBudget:
    """The budget of the calling process; ``root`` lets tests point at fake cgroup files."""
    quota, source = _quota(root)
    return CpuBudget(affinity=_affinity(), quota=quota, quota_source=source)


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _quota(root: Path) -> tuple[float | None, str | None]:
    """The tightest CPU quota on this process's cgroup and its ancestors, v2 or v1."""
    v2_path, v1_path = _own_cgroups(root)
    found: list[tuple[float, str]] = []
    base = root / "sys/fs/cgroup"
    if v2_path is not None:
        # Every level up to the root can carry a limit; the tightest applies.
        for folder in _levels(base, v2_path):
            quota = _read_v2(folder / "cpu.max")
            if quota is not None:
                found.append((quota, str(folder / "cpu.max")))
    if v1_path is not None:
        for mount in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
            for folder in _levels(base / mount, v1_path):
                quota = _read_v1(folder)
                if quota is not None:
                    found.append((quota, str(folder / "cpu.cfs_quota_us")))
    if not found:
        return None, None
    return min(found)


def _own_cgroups(root: Path) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and v1 ``cpu`` controller path, from /proc/self/cgroup."""
    try:
        lines = (root / "proc/self/cgroup").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None, None
    v2: str | None = None
    v1: str | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _levels(base: Path, path: str) -> list[Path]:
    """``base/path`` and each of its ancestors up to ``base``, where they exist."""
    parts = [part for part in path.split("/") if part]
    levels = [base.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
    return [level for level in levels if level.is_dir()]


def _read_v2(file: Path) -> float | None:
    try:
        quota, _, period = file.read_text(encoding="utf-8").strip().partition(" ")
    except OSError:
        return None
    if quota == "max" or not quota:
        return None
    try:
        return int(quota) / int(period or "100000")
    except (ValueError, ZeroDivisionError):
        return None


def _read_v1(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text(encoding="utf-8").strip())
        period = int((folder / "cpu.cfs_period_us").read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None  # -1: no quota
    return quota / period
