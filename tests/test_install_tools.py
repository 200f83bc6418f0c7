"""scripts/install.py test: what it installs beyond pip so that ``python -m pytest`` passes on a
fresh machine (Ray through the ray extra, perf_analyzer, HAProxy and Prometheus), each only
when missing, with one line where the machine does not allow it. The machine is faked: which
tools exist, whether this user is root or may sudo; nothing is installed."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install.py"


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("install_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def machine(*present: str) -> dict[str, str]:
    return {tool: f"/usr/bin/{tool}" for tool in present}


def steps(present: dict[str, str], *, root: bool, sudo: bool, pa: bool) -> tuple[list, list]:
    result: tuple[list, list] = script().tool_steps(
        which=present.get, is_root=root, sudo=lambda: sudo, perf_analyzer=lambda: pa
    )
    return result


def test_root_on_a_fresh_debian_installs_every_missing_tool() -> None:
    commands, notes = steps(machine("apt-get"), root=True, sudo=False, pa=False)
    assert notes == []
    assert commands == [
        ["bash", str(ROOT / "scripts" / "install-perf-analyzer.sh")],
        ["/usr/bin/apt-get", "update", "-qq"],
        [
            *("/usr/bin/apt-get", "install", "-y", "-qq", "--no-install-recommends"),
            *("haproxy", "prometheus"),
        ],
    ]


def test_what_is_there_is_not_installed_again() -> None:
    present = machine("apt-get", "haproxy", "prometheus")
    assert steps(present, root=True, sudo=False, pa=True) == ([], [])
    commands, _ = steps(machine("apt-get", "haproxy"), root=True, sudo=False, pa=True)
    assert commands[-1][-1] == "prometheus" and "haproxy" not in commands[-1]


def test_a_user_with_password_less_sudo_installs_through_it() -> None:
    commands, notes = steps(machine("apt-get"), root=False, sudo=True, pa=True)
    assert notes == []
    assert all(command[:2] == ["sudo", "-n"] for command in commands)


def test_a_user_who_cannot_install_system_packages_gets_one_line() -> None:
    commands, notes = steps(machine("apt-get"), root=False, sudo=False, pa=True)
    assert commands == []
    assert len(notes) == 1
    assert "haproxy and prometheus not installed" in notes[0]
    assert "sudo apt-get install haproxy prometheus" in notes[0]
    _, notes = steps(machine(), root=True, sudo=False, pa=True)
    assert len(notes) == 1 and "no apt-get" in notes[0]


def test_the_test_extra_brings_ray_and_the_dry_run_names_every_step() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    test_extra = pyproject.split("\ntest = [", 1)[1].split("]\n", 1)[0]
    assert '"batching[ray]"' in test_extra
    env = {**os.environ, "BATCHING_TORCH_CPU_INDEX": "http://127.0.0.1:9/"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "test", "--dry-run", "--probe-timeout-s", "0.5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    (pip,) = [line for line in done.stderr.splitlines() if "would run: " in line]
    assert shlex.split(pip.split("would run: ", 1)[1])[-1] == f"{ROOT}[test]"
    expected = script().tool_steps()[0]
    also = [
        line.split("would also run: ", 1)[1]
        for line in done.stderr.splitlines()
        if "would also run: " in line
    ]
    assert also == [shlex.join(step) for step in expected]


def test_ci_runs_the_readme_command_with_the_linters_between() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "set ", "export ", "cd "))
    ]
    assert lines == [
        "python scripts/install.py test",
        "ruff check .",
        "ruff format --check .",
        "mypy",
        "lint-imports",
        "mkdocs build --strict",
        "python -m pytest",
    ]
    readme = (ROOT / "README.md").read_text()
    assert "python scripts/install.py test && python -m pytest" in readme
