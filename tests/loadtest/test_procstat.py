"""``load_test.procstat``: CPU seconds and resident memory of the machine and of process trees."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from load_test.procstat import (
    child_pids,
    machine_cpu_seconds,
    rss_bytes,
    tree_cpu_seconds,
    tree_rss_bytes,
)

MB = 2**20

# Holds 64 MB of written (so resident) memory, says so, and waits for its stdin to close.
HOLD_MEMORY = """
import sys
data = b"x" * (64 << 20)
print("ready", flush=True)
sys.stdin.read()
"""

# Starts a grandchild that burns 0.3 s of CPU, says so, and waits for its stdin to close.
BURN_IN_GRANDCHILD = """
import subprocess, sys
burn = '''
import sys, time
start = time.process_time()
while time.process_time() - start < 0.3:
    pass
print("burnt", flush=True)
sys.stdin.read()
'''
subprocess.run([sys.executable, "-c", burn], check=True)
"""


@contextmanager
def child(script: str, expect: str) -> Iterator[subprocess.Popen[str]]:
    """A Python child running ``script``, once it has printed ``expect``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline().strip()
        assert line == expect, f"child said {line!r}, exit status {proc.poll()}"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


def gone_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def test_procstat_sees_this_process_burn_cpu() -> None:
    busy_before = machine_cpu_seconds()
    before = tree_cpu_seconds(os.getpid())
    spent = time.process_time()
    while time.process_time() - spent < 0.2:
        pass
    after = tree_cpu_seconds(os.getpid())
    busy_after = machine_cpu_seconds()
    assert before is not None and after is not None
    assert after - before >= 0.15  # clock ticks are 10 ms
    assert busy_before is not None and busy_after is not None
    assert busy_after[0] - busy_before[0] > 0


def test_machine_cpu_seconds_are_busy_within_total() -> None:
    reading = machine_cpu_seconds()
    assert reading is not None
    busy, total = reading
    assert 0 < busy < total
    # Seconds of all cores since boot: at least the seconds this process has used.
    assert total >= time.process_time()


def test_tree_cpu_seconds_counts_a_grandchild() -> None:
    own_before = time.process_time()
    before = tree_cpu_seconds(os.getpid())
    with child(BURN_IN_GRANDCHILD, "burnt") as proc:
        (grandchild,) = child_pids(proc.pid)
        assert proc.pid in child_pids(os.getpid())
        assert grandchild not in child_pids(os.getpid())
        assert {proc.pid, grandchild} <= set(child_pids(os.getpid(), recursive=True))
        after = tree_cpu_seconds(os.getpid())
    own = time.process_time() - own_before
    assert before is not None and after is not None
    # The 0.3 s were burnt by the grandchild, not by this process.
    assert after - before - own >= 0.25


def test_tree_rss_grows_by_a_child_holding_memory() -> None:
    own = rss_bytes(os.getpid())
    before = tree_rss_bytes(os.getpid())
    assert own is not None and before is not None
    assert own > 10 * MB  # an interpreter with pytest loaded
    with child(HOLD_MEMORY, "ready") as proc:
        held = rss_bytes(proc.pid)
        during = tree_rss_bytes(os.getpid())
    after = tree_rss_bytes(os.getpid())
    assert held is not None and held >= 64 * MB
    assert during is not None and during - before >= 56 * MB
    assert after is not None and during - after >= 56 * MB  # the child's memory left with it


def test_a_process_that_is_gone_has_no_readings() -> None:
    pid = gone_pid()
    assert rss_bytes(pid) is None
    assert tree_rss_bytes(pid) is None
    assert tree_cpu_seconds(pid) is None
    assert child_pids(pid) == []
