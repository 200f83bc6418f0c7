"""``load_test.overload``: the server's resident memory, in MB."""

from __future__ import annotations

import json
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


@pytest.mark.slow
def test_a_server_far_below_the_models_offline_capacity_fails_with_both_numbers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from load_test.overload import main

    # The "server" is the load-test stand-in, made slow (200 ms per batch); the model measured
    # offline is CostModel, ~8 ms per batch of 32. The run must not report PASS on capacity.
    code = main(
        [
            "--duration",
            "1",
            "--capacity-seconds",
            "1",
            "--offline-seconds",
            "1",
            "--server-cmd",
            "{python} -m tests.support.fake_server --cost-a-ms 200",
            "--",
            "--model",
            "tests.support.models:CostModel",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 1
    assert "FAIL  capacity at least half the model's offline capacity" in out
    assert "is far below the model's offline capacity on this machine" in err
    report = out[out.index("{") : out.rindex("}") + 1]
    numbers = json.loads(report)
    capacity, offline = numbers["capacity_requests_per_s"], numbers["offline_items_per_s_batch_32"]
    assert capacity < 0.5 * offline
    assert f"({capacity:.0f} requests/s" in err and f"({offline:.0f} items/s" in err
