"""A model that cannot be served stops ``python server.py`` with one clear line and a non-zero
exit, never a server that is live but never ready."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


def serve(*flags: str, cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python server.py FLAGS`` to its end (a server that starts fine would time out)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "server.py"), "--port", str(free_port()), *flags],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "nothing was printed"
    return lines[-1]


@pytest.mark.parametrize(
    ("model", "says"),
    [
        (
            "no_such_package.models:Reverser",
            "cannot import module 'no_such_package.models' for --model "
            "no_such_package.models:Reverser (No module named 'no_such_package'); "
            "Python looks for it in the current directory, on PYTHONPATH",
        ),
        ("tests.support.models:NoSuchClass", "has no attribute 'NoSuchClass'"),
        ("./no-such-folder", "is neither an existing model folder nor package.module:Name"),
    ],
)
def test_a_source_that_cannot_be_parsed_stops_the_start_in_one_line(model: str, says: str) -> None:
    finished = serve("--model", model)
    assert finished.returncode == 2
    assert finished.stderr.count("\n") == 1, finished.stderr  # one line, no usage text
    assert finished.stderr.startswith("server.py: error: ")
    assert says in finished.stderr


def test_a_folder_whose_task_cannot_be_inferred_asks_for_one(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}), encoding="utf-8")
    finished = serve("--model", str(tmp_path))
    assert finished.returncode == 2
    assert "no modules.json" in finished.stderr
    assert "--task text-classification" in finished.stderr


def test_a_folder_without_a_model_says_what_is_missing(tmp_path: Path) -> None:
    finished = serve("--model", str(tmp_path), "--task", "text-classification")
    assert finished.returncode == 2
    assert "has no config.json" in finished.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_weights_that_fail_to_load_stop_the_server(kind: str) -> None:
    finished = serve("--model", "tests.support.models:BrokenLoadModel", "--instance-kind", kind)
    assert finished.returncode == 1, finished.stderr
    line = last_line(finished.stderr)
    assert line.startswith("server.py: error: model 'BrokenLoadModel'"), line
    assert "cannot be loaded: OSError: model.safetensors is truncated" in line


@pytest.mark.slow
def test_a_broken_weights_file_in_a_model_folder_stops_the_server(tmp_path: Path) -> None:
    config = {"model_type": "bert", "hidden_size": 8, "num_hidden_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "modules.json").write_text("[]", encoding="utf-8")
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    finished = serve("--model", str(tmp_path), timeout=120)
    assert finished.returncode == 1, finished.stderr
    line = last_line(finished.stderr)
    assert line.startswith(f"server.py: error: model '{tmp_path.name}' ({tmp_path}) cannot be")
