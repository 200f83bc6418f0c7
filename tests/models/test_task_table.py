"""The declared list of tasks: ``--task`` accepts exactly the table's (and sparse-embedding);
a task transformers removed is one line naming what to use instead, keeping transformers' own
hint; any other task is one line listing the served ones. Both exit 2 before a port is bound."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from transformers.pipelines import REMOVED_TASKS

from batching.models.parameters import Param
from batching.models.source import ModelSource, ModelSourceError
from batching.models.tasks.audio import ASR, CLASSIFY
from batching.models.tasks.table import ALIASES, REMOVED, TASKS, resolve_task, served_tasks
from batching.settings.cli import parse_settings
from tests.support.audio import classifier_folder as audio_classifier_folder
from tests.support.audio import ctc_folder
from tests.support.tiny import classifier_folder, encoder_folder, masked_folder
from tests.support.vision import classifier_folder as image_classifier_folder
from tests.support.vision import clip_folder

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(encoder_folder(tmp_path_factory.mktemp("table")))


@pytest.fixture(scope="module")
def audio_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The audio and image tasks check their folder at start (a feature extractor or an image
    processor; CTC for speech)."""
    root = tmp_path_factory.mktemp("table-audio")
    return {
        ASR: str(ctc_folder(root)),
        CLASSIFY: str(audio_classifier_folder(root)),
        "image-classification": str(image_classifier_folder(root)),
        "image-text-embedding": str(clip_folder(root)),
    }


def test_every_row_names_a_class_that_serves_it_and_its_parameters() -> None:
    for task, row in TASKS.items():
        params = row.declared()
        assert all(isinstance(param, Param) for param in params), task
        assert len({param.name for param in params}) == len(params), task
        assert callable(row.server_class()), task
    for alias, task in ALIASES.items():
        assert task in TASKS and resolve_task(alias) == task


def test_the_table_keeps_transformers_own_hint_for_every_task_it_removed() -> None:
    for task, hint in REMOVED_TASKS.items():
        if task not in TASKS:
            assert REMOVED[task][0] == hint, task


def test_task_accepts_exactly_the_served_tasks(folder: str, audio_folders: dict[str, str]) -> None:
    # zero-shot-classification refuses a model whose config names no entailment label.
    root = Path(folder).parent
    nli = str(classifier_folder(root, "nli", ["contradiction", "neutral", "entailment"]))
    folders = {**audio_folders, "zero-shot-classification": nli}
    for task in served_tasks():
        source = ModelSource.parse(folders.get(task, folder), task)
        assert source.kind == "pipeline" and source.task == ALIASES.get(task, task)
    masked = str(masked_folder(Path(folder).parent))
    assert ModelSource.parse(masked, "sparse-embedding").kind == "sparse"
    # Pipelines transformers has that no row serves are refused, as are made-up names.
    for task in ("table-question-answering", "object-detection", "depth-estimation", "nope"):
        if task in TASKS:
            continue
        with pytest.raises(ModelSourceError) as refused:
            ModelSource.parse(folder, task)
        message = str(refused.value)
        assert message.startswith(f"--task {task} is not served; served tasks: ")
        assert all(name in message for name in served_tasks()) and "\n" not in message


@pytest.mark.parametrize("task", sorted(REMOVED))
def test_a_removed_task_says_what_to_use_instead(
    folder: str, task: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert task not in TASKS
    hint, instead = REMOVED[task]
    with pytest.raises(SystemExit) as caught:
        parse_settings(["--model", folder, "--task", task], {})
    assert caught.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"--task {task}: transformers 5 removed this pipeline ({hint}); {instead}." in line


def test_the_server_exits_2_with_one_line_before_binding(folder: str) -> None:
    task = next(name for name in ("question-answering", "conversational") if name not in TASKS)
    done = subprocess.run(
        [sys.executable, str(ROOT / "server.py"), "--model", folder, "--task", task],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"BATCHING_PORT": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "removed this pipeline" in line and "Uvicorn" not in done.stdout + done.stderr
