"""Install this project and the right build of torch into the Python that runs this script.

    python scripts/install.py              # the server
    python scripts/install.py test         # the server and everything its tests need
    python scripts/install.py --dry-run    # say what would be installed, install nothing

``test`` installs what ``python -m pytest`` needs on a fresh machine: the ``test`` extra (which
includes Ray Serve, for tests/deployment/test_ray.py and for mypy's check of batching/ray.py),
Triton's perf_analyzer (scripts/install-perf-analyzer.sh, unless it already runs), and HAProxy and
Prometheus from the system's packages (apt-get as root, or with ``sudo -n``), each only when
missing. Where the machine does not allow a system install (not root, no password-less sudo,
no apt-get), one line says what to install by hand, and the rest goes on.

It runs one ``pip install`` (``python -m pip``, so a virtual environment's python installs
into that environment) of ``torch==TORCH_VERSION`` and ``-e ".[extras]"``, and chooses which
build of torch by the machine, printing its choice:

- a GPU machine (``nvidia-smi -L`` lists a GPU): PyPI's torch, which for Linux x86_64 is the
  CUDA build; a CPU-only wheel from a local wheel cache is refused (``!=VERSION+cpu``), since it
  would otherwise win by its higher local version.
- a CPU-only Linux machine: exactly ``VERSION+cpu``, the CPU build (~200 MB instead of
  several GB of nvidia-* packages). It comes from PyTorch's CPU index, added as an extra
  index only after a short probe shows that it answers (so an unreachable index never slows
  pip down), or from pip's own sources (a local wheel cache, ``--find-links``). When neither
  has it, pip stops with an error and this script says how to go on, instead of pulling the
  CUDA build.
- macOS and Windows: PyPI's torch, which is the CPU build there.

``--torch cpu|cuda`` overrides the detection; ``--torch keep`` leaves torch to you (a ROCm or
another CUDA build you installed first: pip keeps it when it satisfies ``pyproject.toml``).
Standard library only, so that it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

TORCH_VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: Tests point the probe at a local index: the URL of PyTorch's CPU index to use.
CPU_INDEX_ENV = "BATCHING_TORCH_CPU_INDEX"
ROOT = Path(__file__).resolve().parent.parent
MIN_PYTHON = (3, 11)


def say(message: str) -> None:
    print(f"install.py: {message}", file=sys.stderr, flush=True)


def gpu_present() -> tuple[bool, str]:
    """Whether ``nvidia-smi -L`` lists at least one GPU, and what it said."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False, "nvidia-smi not found"
    try:
        listing = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"nvidia-smi -L failed ({error})"
    gpus = [line for line in listing.stdout.splitlines() if line.startswith("GPU ")]
    if listing.returncode != 0 or not gpus:
        return False, f"nvidia-smi -L listed no GPU (exit status {listing.returncode})"
    return True, f"nvidia-smi -L: {gpus[0].strip()}" + (
        f" and {len(gpus) - 1} more" if len(gpus) > 1 else ""
    )


def index_answers(url: str, timeout_s: float) -> tuple[bool, str]:
    """Whether the index's page for torch answers within ``timeout_s``."""
    page = url.rstrip("/") + "/torch/"
    try:
        with urllib.request.urlopen(page, timeout=timeout_s) as answer:
            return answer.status == 200, f"HTTP {answer.status}"
    except urllib.error.HTTPError as error:
        return False, f"HTTP {error.code}"
    except (OSError, ValueError) as error:  # DNS, refused, timed out, TLS, a bad URL
        reason = getattr(error, "reason", error)
        return False, f"{type(reason).__name__}: {reason}"


#: System packages the tests run (tests/deployment/test_fleet.py: haproxy;
#: tests/deployment/test_promql.py: prometheus).
SYSTEM_TOOLS = ("haproxy", "prometheus")
PERF_ANALYZER = ROOT / "scripts" / "perf_analyzer"


def perf_analyzer_runs() -> bool:
    try:
        done = subprocess.run(
            [str(PERF_ANALYZER), "--version"], capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def sudo_works() -> bool:
    """Whether ``sudo -n`` runs a command without asking for a password."""
    if shutil.which("sudo") is None:
        return False
    try:
        done = subprocess.run(["sudo", "-n", "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def tool_steps(
    *,
    which: Callable[[str], str | None] = shutil.which,
    is_root: bool | None = None,
    sudo: Callable[[], bool] = sudo_works,
    perf_analyzer: Callable[[], bool] = perf_analyzer_runs,
) -> tuple[list[list[str]], list[str]]:
    """What ``test`` runs after pip, each only when missing: the commands, and a line for each
    tool this machine does not let the script install."""
    commands: list[list[str]] = []
    notes: list[str] = []
    if not perf_analyzer():
        commands.append(["bash", str(ROOT / "scripts" / "install-perf-analyzer.sh")])
    missing = [tool for tool in SYSTEM_TOOLS if which(tool) is None]
    if not missing:
        return commands, notes
    root = (os.geteuid() == 0) if is_root is None and hasattr(os, "geteuid") else bool(is_root)
    apt = which("apt-get")
    if apt is None:
        notes.append(
            f"{' and '.join(missing)} not installed, and there is no apt-get here: install "
            "them with the system's package manager (tests/deployment/test_fleet.py and "
            "tests/deployment/test_promql.py run them)"
        )
        return commands, notes
    prefix = [] if root else ["sudo", "-n"] if sudo() else None
    if prefix is None:
        notes.append(
            f"{' and '.join(missing)} not installed, and this user cannot install system "
            f"packages (not root, sudo -n asks for a password): run 'sudo apt-get install "
            f"{' '.join(missing)}' (tests/deployment/test_fleet.py and "
            f"tests/deployment/test_promql.py run them)"
        )
        return commands, notes
    commands.append([*prefix, apt, "update", "-qq"])
    commands.append([*prefix, apt, "install", "-y", "-qq", "--no-install-recommends", *missing])
    return commands, notes


def plan(
    extras: list[str], torch_choice: str, probe_timeout_s: float
) -> tuple[list[str], list[str]]:
    """The ``pip install`` arguments, and the lines that explain the choice."""
    why: list[str] = []
    pip_options: list[str] = []
    if torch_choice == "auto":
        gpu, seen = gpu_present()
        if gpu:
            torch_choice = "cuda"
            why.append(f"GPU found ({seen}): the CUDA build of torch")
        elif sys.platform.startswith("linux"):
            torch_choice = "cpu"
            why.append(f"no GPU ({seen}): the CPU build of torch")
        else:
            torch_choice = "pypi"
            why.append(f"no GPU ({seen}), {platform.system()}: PyPI's torch is the CPU build")
    else:
        why.append(f"--torch {torch_choice}")

    if torch_choice == "cuda":
        requirement = [f"torch=={TORCH_VERSION},!={TORCH_VERSION}+cpu"]
    elif torch_choice == "cpu":
        requirement = [f"torch=={TORCH_VERSION}+cpu"]
        index = os.environ.get(CPU_INDEX_ENV) or CPU_INDEX
        answers, detail = index_answers(index, probe_timeout_s)
        if answers:
            why.append(f"PyTorch's CPU index answers ({index}: {detail}): an extra index")
            # Short per-request timeout and few retries: a slow index cannot stall the install.
            pip_options = ["--extra-index-url", index, "--timeout", "15", "--retries", "2"]
        else:
            why.append(
                f"PyTorch's CPU index does not answer ({index}: {detail}, within "
                f"{probe_timeout_s:g} s): not used; torch {TORCH_VERSION}+cpu must come from "
                "pip's other sources (a local wheel cache, --find-links)"
            )
    elif torch_choice == "pypi":
        requirement = [f"torch=={TORCH_VERSION}"]
    else:  # keep
        requirement = []
        why.append("torch left as installed (or pyproject.toml's range if it is missing)")

    target = str(ROOT) + (f"[{','.join(extras)}]" if extras else "")
    return ["install", *pip_options, *requirement, "-e", target], why


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python scripts/install.py",
        description="Install this project with the build of torch this machine needs.",
    )
    parser.add_argument("extras", nargs="*", help="extras of pyproject.toml: test, loadtest, ray")
    parser.add_argument(
        "--torch",
        choices=["auto", "cpu", "cuda", "keep"],
        default="auto",
        help="which build of torch: auto (by nvidia-smi), cpu, cuda, or keep the installed one",
    )
    parser.add_argument(
        "--probe-timeout-s",
        type=float,
        default=5.0,
        help="how long PyTorch's CPU index may take to answer the probe (default 5)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the pip command; install nothing"
    )
    args = parser.parse_args(argv)
    if sys.version_info < MIN_PYTHON:
        say(
            f"this project needs Python {'.'.join(map(str, MIN_PYTHON))} or newer; this is "
            f"{platform.python_version()} ({sys.executable})"
        )
        return 2
    extras = [extra for arg in args.extras for extra in arg.split(",") if extra]
    pip_args, why = plan(extras, args.torch, args.probe_timeout_s)
    for line in why:
        say(line)
    command = [sys.executable, "-m", "pip", *pip_args]
    say(("would run: " if args.dry_run else "running: ") + shlex.join(command))
    steps: list[list[str]] = []
    if "test" in extras:
        steps, notes = tool_steps()
        for note in notes:
            say(note)
    if args.dry_run:
        for step in steps:
            say("would also run: " + shlex.join(step))
        return 0
    status = subprocess.run(command, check=False).returncode
    if status != 0 and f"torch=={TORCH_VERSION}+cpu" in pip_args:
        say(
            f"pip failed. If it found no torch {TORCH_VERSION}+cpu: PyTorch's CPU index "
            f"({CPU_INDEX}) could not be reached and no local wheel has it. Retry where the "
            "index answers, or pass --torch cuda to take PyPI's CUDA build (several GB)."
        )
    if status != 0:
        return status
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in steps:
        say("running: " + shlex.join(step))
        done = subprocess.run(step, env=environment, check=False).returncode
        if done != 0:
            say(f"failed (exit status {done}): {shlex.join(step)}")
            return done
    return 0


if __name__ == "__main__":
    sys.exit(main())
