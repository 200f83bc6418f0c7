"""The CPU budget comes from the environment: the affinity mask and the cgroup CPU quota, read
here from fake cgroup trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batching.runtime.cpus import CpuBudget, read_cpu_budget
from batching.settings.cli import parse_settings

AFFINITY = len(os.sched_getaffinity(0))


def fake_root(tmp_path: Path, cgroup: str, files: dict[str, str]) -> Path:
    """A root with ``/proc/self/cgroup`` holding ``cgroup`` and the given files under it."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup, encoding="utf-8")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    ("cgroup", "files", "quota"),
    [
        # cgroup v2: cpu.max "quota period", on the process's own group
        (
            "0::/kubepods/pod1/c1\n",
            {"sys/fs/cgroup/kubepods/pod1/c1/cpu.max": "150000 100000\n"},
            1.5,
        ),
        # ... or on an ancestor: the tightest level wins
        (
            "0::/kubepods/pod1/c1\n",
            {
                "sys/fs/cgroup/kubepods/pod1/c1/cpu.max": "max 100000\n",
                "sys/fs/cgroup/kubepods/pod1/cpu.max": "50000 100000\n",
                "sys/fs/cgroup/kubepods/cpu.max": "400000 100000\n",
            },
            0.5,
        ),
        # no limit anywhere
        ("0::/user.slice\n", {"sys/fs/cgroup/user.slice/cpu.max": "max 100000\n"}, None),
        # cgroup v1: cfs quota and period under the cpu controller
        (
            "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n",
            {
                "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
                "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            },
            3.0,
        ),
        # v1 with no quota (-1)
        (
            "3:cpu,cpuacct:/\n",
            {
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            },
            None,
        ),
        # no cgroup files at all (not Linux, or not mounted)
        ("", {}, None),
    ],
)
def test_the_quota_is_read_from_cgroup_v2_and_v1(
    tmp_path: Path, cgroup: str, files: dict[str, str], quota: float | None
) -> None:
    budget = read_cpu_budget(fake_root(tmp_path, cgroup, files))
    assert budget.quota == quota
    assert budget.affinity == AFFINITY  # the real mask of this process
    assert (budget.quota_source is None) == (quota is None)


@pytest.mark.parametrize(
    ("affinity", "quota", "cores"),
    [
        (8, None, 8),
        (8, 2.0, 2),
        (8, 1.5, 1),  # a thread per partial core would be throttled
        (8, 0.5, 1),  # never fewer than one
        (1, 4.0, 1),  # taskset to one core beats a larger quota
        (4, 6.0, 4),
    ],
)
def test_the_budget_is_the_tighter_of_affinity_and_quota(
    affinity: int, quota: float | None, cores: int
) -> None:
    assert CpuBudget(affinity=affinity, quota=quota).cores == cores


@pytest.mark.parametrize(
    ("budget", "argv", "threads", "instances"),
    [
        (CpuBudget(affinity=8, quota=2.0, quota_source="cpu.max"), [], 2, 1),
        # thread instances share the budget's cores batch by batch: each may use them all
        (CpuBudget(affinity=8, quota=4.0, quota_source="cpu.max"), ["--instances", "2"], 4, 2),
        (CpuBudget(affinity=1, quota=None), [], 1, 1),
        # --instances cpu_count means the budget's cores, not the machine's
        (
            CpuBudget(affinity=16, quota=3.0, quota_source="cpu.max"),
            ["--instances", "cpu_count"],
            3,
            3,
        ),
        # the flag still overrides
        (CpuBudget(affinity=8, quota=2.0, quota_source="cpu.max"), ["--torch-threads", "4"], 4, 1),
    ],
)
def test_the_budget_decides_torch_threads_and_instances_and_flags_override(
    budget: CpuBudget, argv: list[str], threads: int, instances: int
) -> None:
    settings = parse_settings(["--model", "tests.support.models:EchoModel", *argv], {}, budget)
    assert settings.torch_threads == threads
    assert len(settings.models[0].devices) == instances
    assert settings.cpu_budget == budget


def test_the_budget_says_what_was_found_and_chosen() -> None:
    budget = CpuBudget(affinity=8, quota=1.5, quota_source="/sys/fs/cgroup/cpu.max")
    assert budget.describe() == (
        "8 cores in the affinity mask, a quota of 1.5 cores (/sys/fs/cgroup/cpu.max): budget 1"
    )
