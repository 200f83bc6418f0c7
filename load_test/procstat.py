"""CPU use and resident memory of the whole machine and of process trees, read with psutil.

The tool runs beside the server on the same few cores; these readings tell apart "the server
was busy", "the tool was busy" and "something else on the machine was busy", which a latency
number cannot. A reading psutil cannot take (the process is gone, or not ours to inspect)
is None, and the checks that need it are skipped.
"""

from __future__ import annotations

import psutil

__all__ = [
    "child_pids",
    "machine_cpu_seconds",
    "rss_bytes",
    "tree_cpu_seconds",
    "tree_rss_bytes",
]


def machine_cpu_seconds() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of all cores since boot.

    Idle and I/O wait count as not busy. Guest time is left out of the total, as the kernel
    already counts it in user and nice time.
    """
    try:
        times = psutil.cpu_times()
    except (psutil.Error, OSError):
        return None
    fields = times._asdict()
    total = sum(fields.values()) - fields.get("guest", 0.0) - fields.get("guest_nice", 0.0)
    idle = fields["idle"] + fields.get("iowait", 0.0)
    return total - idle, total


def _tree(pid: int) -> list[psutil.Process] | None:
    """The process ``pid`` followed by its live descendants, or None if it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return None


def _cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of one process (not of its reaped children); 0 if gone."""
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds used so far by ``pid`` and its live descendants (model instance processes)."""
    tree = _tree(pid)
    if tree is None:
        return None
    try:
        root = tree[0].cpu_times()
    except psutil.Error:
        return None
    return root.user + root.system + sum(_cpu_seconds(child) for child in tree[1:])


def rss_bytes(pid: int) -> int | None:
    """Resident memory of one process, in bytes, or None if it cannot be read."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


def child_pids(pid: int, *, recursive: bool = False) -> list[int]:
    """The pids of the children of ``pid`` (all descendants if ``recursive``); [] if gone."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=recursive)]
    except psutil.Error:
        return []


def tree_rss_bytes(pid: int) -> int | None:
    """Resident memory of ``pid`` plus its live descendants, in bytes (shared pages counted
    once per process), or None if ``pid`` cannot be read."""
    tree = _tree(pid)
    if tree is None:
        return None
    try:
        total = int(tree[0].memory_info().rss)
    except psutil.Error:
        return None
    for child in tree[1:]:
        try:
            total += int(child.memory_info().rss)
        except psutil.Error:
            continue  # exited since it was listed
    return total
