"""``load_test.overload``: the server's resident memory, in MB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from load_test.overload import rss_mb


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="compares with Linux's /proc")
def test_rss_mb_is_the_kernels_vmrss_in_mb() -> None:
    def vm_rss_mb() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS line in /proc/self/status")

    before = vm_rss_mb()
    reading = rss_mb(os.getpid())
    after = vm_rss_mb()
    # MB of 2**20 bytes, as the kernel's kB / 1024; the process may move a little between.
    assert min(before, after) - 2 <= reading <= max(before, after) + 2


def test_rss_mb_of_a_process_that_is_gone_raises() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    with pytest.raises(RuntimeError, match=str(proc.pid)):
        rss_mb(proc.pid)
