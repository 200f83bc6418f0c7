"""scripts/install.py: which torch it asks pip for, by GPU presence and by whether PyTorch's CPU
index answers; and that pip, given that command, resolves the build it should.

The machine is faked, never the script: a fake ``nvidia-smi`` on PATH, PyTorch's CPU index
played by a local HTTP server (answering, refusing, or accepting and never answering), and
pip's sources by tiny local wheels named as torch's are (``2.13.0`` for PyPI's CUDA build,
``2.13.0+cpu`` for the CPU build), so nothing here leaves the machine.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install.py"
VERSION = re.search(r'^TORCH_VERSION = "([^"]+)"', SCRIPT.read_text(), re.M).group(1)  # type: ignore[union-attr]


def fake_nvidia_smi(folder: Path, *, lists_gpu: bool) -> None:
    smi = folder / "nvidia-smi"
    if lists_gpu:
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-0000)'\n")
    else:  # what a machine with the tools but no usable driver prints
        smi.write_text(
            "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with "
            "the NVIDIA driver.' >&2\nexit 9\n"
        )
    smi.chmod(0o755)


def dry_run(
    tmp_path: Path, index: str, *args: str, smi: bool | None = None
) -> tuple[list[str], str, float]:
    """The pip arguments the script would run, what it said, and how long it took."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if smi is not None:
        fake_nvidia_smi(bin_dir, lists_gpu=smi)
    env = {**os.environ, "PATH": str(bin_dir), "BATCHING_TORCH_CPU_INDEX": index}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    took = time.monotonic() - started
    (line,) = [line for line in done.stderr.splitlines() if "would run: " in line]
    command = shlex.split(line.split("would run: ", 1)[1])
    assert command[:4] == [sys.executable, "-m", "pip", "install"], command
    return command[3:], done.stderr, took


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(folder: Path) -> Iterator[str]:
    """``folder`` over HTTP on 127.0.0.1: its directory listings are a PEP 503 simple index."""
    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent_port() -> Iterator[str]:
    """A port that accepts connections and never answers: an index behind a black hole."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/whl/cpu"


def refused_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/whl/cpu"  # nothing listens there any more


def wheel(folder: Path, version: str) -> Path:
    """A minimal torch wheel of that version (a stand-in: pip reads only its name and metadata)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


# -- the choice ------------------------------------------------------------------------------


def test_no_gpu_and_the_cpu_index_answers_adds_it_as_an_extra_index(tmp_path: Path) -> None:
    (tmp_path / "index" / "torch").mkdir(parents=True)
    with serving(tmp_path / "index") as index:
        pip, said, _ = dry_run(tmp_path, index)
    assert f"torch=={VERSION}+cpu" in pip
    assert pip[pip.index("--extra-index-url") + 1] == index
    assert "--index-url" not in pip  # PyPI stays the index for everything else
    timeout = float(pip[pip.index("--timeout") + 1])
    assert timeout <= 30
    assert pip[-2:] == ["-e", str(ROOT)]
    assert "no GPU (nvidia-smi not found): the CPU build" in said


@pytest.mark.parametrize("answer", ["refused", "silent", "404"])
def test_an_index_that_does_not_answer_is_left_out_within_the_probe_timeout(
    tmp_path: Path, answer: str
) -> None:
    with contextlib.ExitStack() as stack:
        if answer == "refused":
            index = refused_url()
        elif answer == "silent":
            index = stack.enter_context(silent_port())
        else:
            (tmp_path / "empty").mkdir()
            index = stack.enter_context(serving(tmp_path / "empty"))
        pip, said, took = dry_run(tmp_path, index, "test", "--probe-timeout-s", "1")
    assert f"torch=={VERSION}+cpu" in pip
    assert "--extra-index-url" not in pip and index not in pip
    assert pip[-2:] == ["-e", f"{ROOT}[test]"]
    assert "does not answer" in said and "pip's other sources" in said
    assert took < 10, took


def test_a_gpu_gets_pypis_cuda_build_and_never_a_cached_cpu_wheel(tmp_path: Path) -> None:
    (tmp_path / "index" / "torch").mkdir(parents=True)
    with serving(tmp_path / "index") as index:
        pip, said, _ = dry_run(tmp_path, index, "test,ray", smi=True)
    assert f"torch=={VERSION},!={VERSION}+cpu" in pip
    assert "--extra-index-url" not in pip  # no CPU index, however well it answers
    assert pip[-2:] == ["-e", f"{ROOT}[test,ray]"]
    assert "GPU found (nvidia-smi -L: GPU 0: NVIDIA A100" in said


def test_nvidia_smi_without_a_working_driver_is_no_gpu(tmp_path: Path) -> None:
    pip, said, _ = dry_run(tmp_path, refused_url(), smi=False)
    assert f"torch=={VERSION}+cpu" in pip
    assert "nvidia-smi -L listed no GPU (exit status 9)" in said


def test_the_choice_can_be_forced(tmp_path: Path) -> None:
    pip, _, _ = dry_run(tmp_path, refused_url(), "--torch", "cuda")
    assert f"torch=={VERSION},!={VERSION}+cpu" in pip
    pip, _, _ = dry_run(tmp_path, refused_url(), "--torch", "cpu", smi=True)
    assert f"torch=={VERSION}+cpu" in pip
    pip, _, _ = dry_run(tmp_path, refused_url(), "--torch", "keep", smi=True)
    assert not any(arg.startswith("torch") for arg in pip)
    assert pip == ["install", "-e", str(ROOT)]


# -- what pip makes of it --------------------------------------------------------------------


def resolve(
    pip: list[str], tmp_path: Path, pypi: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    """Run the script's pip command the way a machine without this one's wheel cache would
    (``--isolated``: no pip configuration, no PIP_* variables), as a dry run that writes a
    report. PyPI is played by ``pypi``; the project itself (``-e``) is left out: building its
    metadata is not the question, and torch is."""
    assert pip[-2] == "-e"
    report = tmp_path / "report.json"
    command = [
        *(sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", *pip[:-2]),
        *("--index-url", pypi, "--no-deps", "--ignore-installed", "--dry-run", "--quiet"),
        *("--report", str(report), *extra),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def resolved_torch(tmp_path: Path) -> str:
    report = json.loads((tmp_path / "report.json").read_text())
    (torch,) = [item for item in report["install"] if item["metadata"]["name"] == "torch"]
    return str(torch["metadata"]["version"])


@pytest.fixture
def sources(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """PyPI (the plain version, as PyPI's CUDA build is), PyTorch's CPU index, and a local
    wheel cache (both with the +cpu build), all on this machine."""
    wheel(tmp_path / "www" / "pypi" / "torch", VERSION)
    wheel(tmp_path / "www" / "cpu" / "torch", f"{VERSION}+cpu")
    cache = tmp_path / "wheels"
    wheel(cache, f"{VERSION}+cpu")
    with serving(tmp_path / "www") as root:
        yield f"{root}/pypi", f"{root}/cpu", cache


def test_pip_resolves_the_cpu_build_from_the_cpu_index(
    tmp_path: Path, sources: tuple[str, str, Path]
) -> None:
    pypi, cpu, _ = sources
    pip, _, _ = dry_run(tmp_path, cpu)
    assert "--extra-index-url" in pip
    done = resolve(pip, tmp_path, pypi)
    assert done.returncode == 0, done.stderr
    assert resolved_torch(tmp_path) == f"{VERSION}+cpu"


def test_pip_resolves_the_cpu_build_from_a_local_cache_when_the_index_is_unreachable(
    tmp_path: Path, sources: tuple[str, str, Path]
) -> None:
    pypi, _, cache = sources
    pip, _, _ = dry_run(tmp_path, refused_url())
    done = resolve(pip, tmp_path, pypi, "--find-links", str(cache))
    assert done.returncode == 0, done.stderr
    assert resolved_torch(tmp_path) == f"{VERSION}+cpu"
    # The ordering a plain pin relies on: with both on offer, pip prefers the +cpu build.
    plain = [arg if not arg.startswith("torch==") else f"torch=={VERSION}" for arg in pip]
    done = resolve(plain, tmp_path, pypi, "--find-links", str(cache))
    assert done.returncode == 0, done.stderr
    assert resolved_torch(tmp_path) == f"{VERSION}+cpu"


def test_without_the_cpu_build_anywhere_pip_stops_instead_of_taking_the_cuda_build(
    tmp_path: Path, sources: tuple[str, str, Path]
) -> None:
    pypi, _, _ = sources
    pip, _, _ = dry_run(tmp_path, refused_url())
    done = resolve(pip, tmp_path, pypi)
    assert done.returncode != 0
    assert f"torch=={VERSION}+cpu" in done.stderr  # pip names the build it could not find
    assert not (tmp_path / "report.json").exists()


def test_a_gpu_machine_with_a_cpu_wheel_cache_still_gets_pypis_build(
    tmp_path: Path, sources: tuple[str, str, Path]
) -> None:
    pypi, _, cache = sources
    pip, _, _ = dry_run(tmp_path, refused_url(), smi=True)
    done = resolve(pip, tmp_path, pypi, "--find-links", str(cache))
    assert done.returncode == 0, done.stderr
    assert resolved_torch(tmp_path) == VERSION
