"""CPU use of the whole machine and of a process tree, read from Linux's /proc.

The tool runs beside the server on the same few cores; these readings tell apart "the server
was busy", "the tool was busy" and "something else on the machine was busy", which a latency
number cannot. Elsewhere than Linux every reading is None and the checks that need it are
skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["machine_ticks", "tree_cpu_seconds"]

_PROC = Path("/proc")


def machine_ticks() -> tuple[int, int] | None:
    """(busy, total) CPU ticks of all cores since boot, from /proc/stat."""
    try:
        with open(_PROC / "stat", "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user+system CPU seconds) of one process."""
    try:
        raw = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after its last ')'.
    fields = raw[raw.rindex(b")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12])
    return int(fields[1]), ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds used so far by ``pid`` and its live descendants (model instance processes)."""
    root = _stat(pid)
    if root is None:
        return None
    parents: dict[int, list[int]] = {}
    cpu: dict[int, float] = {pid: root[1]}
    try:
        entries = [int(p.name) for p in _PROC.iterdir() if p.name.isdigit()]
    except OSError:
        return root[1]
    for child in entries:
        if child == pid:
            continue
        stat = _stat(child)
        if stat is not None:
            parents.setdefault(stat[0], []).append(child)
            cpu[child] = stat[1]
    total = 0.0
    stack = [pid]
    while stack:
        current = stack.pop()
        total += cpu.get(current, 0.0)
        stack.extend(parents.get(current, []))
    return total
