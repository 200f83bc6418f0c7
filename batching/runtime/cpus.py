"""The CPU budget of this process, read from the environment it actually runs in.

``os.cpu_count()`` counts the machine's cores, not the ones this process may use: a container
with a CPU quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``) or a narrowed affinity mask
(``taskset``, a cpuset) gets far less, and torch thread teams sized to the machine then wait on
each other at every barrier. The budget is the smaller of the affinity mask and the quota.

It also bounds how many model instances the process holds at once (:class:`InstanceBudget`):
each is a thread (or a child process) with a copy of a model, and past a few per core they only
wait on each other while their copies take the memory.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["INSTANCES_PER_CORE", "CpuBudget", "InstanceBudget", "read_cpu_budget"]

#: The most model instances (of every model, on every device) per core of the CPU budget.
#: Beyond one per core each instance gets one torch thread (:func:`torch_threads_for
#: <batching.settings.engines.torch_threads_for>`); beyond a few they only queue for the cores.
INSTANCES_PER_CORE = 4


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


@dataclass(frozen=True, slots=True)
class InstanceBudget:
    """The most model instances the process holds at once: :data:`INSTANCES_PER_CORE` per
    core of its CPU budget, whatever the device, summed over every model. The start-up
    configuration (flags and repository) and every load at run time are held to it.
    """

    #: The cores of the CPU budget.
    cores: int
    #: The instances the other models already take.
    used: int = 0

    @classmethod
    def of(cls, budget: CpuBudget) -> InstanceBudget:
        return cls(cores=budget.cores)

    @property
    def limit(self) -> int:
        return self.cores * INSTANCES_PER_CORE

    def beside(self, used: int) -> InstanceBudget:
        """This budget once the other models take ``used`` instances."""
        return replace(self, used=used)

    def check(self, count: int) -> None:
        """Whether ``count`` more instances fit.

        :raises ValueError: they do not; the message names the bound and how it is reached.
        """
        if self.used + count <= self.limit:
            return
        others = f", and the other models take {self.used}" if self.used else ""
        raise ValueError(
            f"at most {self.limit} model instances in all ({INSTANCES_PER_CORE} per core of a "
            f"CPU budget of {self.cores} cores){others}"
        )


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
