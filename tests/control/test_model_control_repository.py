"""Model control reading a real repository: the flags, a load call's overrides, and poll mode
applying what changed in the folders (added, changed, removed, broken)."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http
from prometheus_client import CollectorRegistry

from batching import ModelConfig, create_app
from batching.control import ControlOptions
from batching.errors import InvalidRequest
from batching.settings.cli import parse_settings
from batching.settings.reloads import apply_overrides, repository_reader
from tests.support import versions
from tests.support.asgi import serving
from tests.support.threaded import serving_in_thread
from tests.support.tiny import sentence_folder

pytestmark = pytest.mark.anyio

MODULE = "tests.support.versions"


def write_model(root: Path, name: str, cls: str, version: str) -> None:
    folder = root / name
    folder.mkdir(exist_ok=True)
    (folder / "config.toml").write_text(
        f'source = "{MODULE}:{cls}"\nversion = "{version}"\nmax_batch_size = 8\n'
    )


def test_the_flags_and_their_twins(tmp_path: Path) -> None:
    write_model(tmp_path, "m", "VersionOne", "1")
    assert parse_settings([]).model_control.mode == "none"
    settings = parse_settings(["--model-control-mode", "explicit"])
    assert settings.model_control.mode == "explicit"
    assert settings.model_control.read_repository is None  # the flags' model is reloaded
    environ = {
        "BATCHING_MODEL_CONTROL_MODE": "poll",
        "BATCHING_REPOSITORY_POLL_SECS": "2.5",
        "BATCHING_MODEL_REPOSITORY": str(tmp_path),
    }
    polled = parse_settings([], environ).model_control
    assert (polled.mode, polled.poll_seconds) == ("poll", 2.5)
    assert polled.read_repository is not None
    assert [e.config.version for e in polled.read_repository()] == ["1"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model-control-mode", "poll"], "needs --model-repository"),
        (["--model-control-mode", "sometimes"], "invalid choice"),
        (["--repository-poll-secs", "0"], "must be > 0"),
    ],
)
def test_bad_flags_exit_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_overrides_keep_the_source_and_refuse_what_is_not_theirs() -> None:
    base = ModelConfig(name="m", source=f"{MODULE}:VersionOne", version="1")
    changed = apply_overrides(
        base,
        {"name": "m", "max_batch_size": 4, "instance_group": [{"count": 2, "kind": "cpu"}]},
    )
    assert changed.source == base.source and changed.name == "m" and changed.version == "1"
    assert changed.batching.max_batch_size == 4 and len(changed.devices) == 2
    cases: list[tuple[dict[str, Any], str]] = [
        ({"source": "/etc"}, "config: source"),
        ({"task": "fill-mask"}, "config: task"),
        ({"warmup": {"data": "file", "file": "/etc/passwd"}}, "config: warmup"),
        ({"name": "other"}, "config: name"),
        ({"engine": "fast"}, "engine"),
    ]
    for bad, named in cases:
        with pytest.raises(InvalidRequest, match=named):
            apply_overrides(base, bad)


def test_a_broken_repository_is_a_400_naming_no_path_of_the_machine(tmp_path: Path) -> None:
    write_model(tmp_path, "m", "VersionOne", "1")
    (tmp_path / "m" / "config.toml").write_text("max_batch_size = 'many'\n")
    with pytest.raises(InvalidRequest) as raised:
        repository_reader(str(tmp_path), None)()
    assert str(tmp_path) not in str(raised.value)
    assert "repository/m/config.toml" in str(raised.value)


async def test_poll_applies_what_changed_in_the_repository(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    versions.reset()
    write_model(tmp_path, "m", "VersionOne", "1")
    read = repository_reader(str(tmp_path), None)
    options = ControlOptions(mode="poll", poll_seconds=3600, read_repository=read)
    app = create_app(
        [entry.config for entry in read()], model_control=options, registry=CollectorRegistry()
    )
    control = app.state.control

    async def answer(model: str) -> str | int:
        got = await asyncio.create_task(
            client.post(
                f"/v2/models/{model}/infer",
                json={
                    "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]
                },
            )
        )
        return got.json()["outputs"][0]["data"][0] if got.status_code == 200 else got.status_code

    async with serving(app) as client:
        await control.poll_once()  # nothing changed: nothing reloaded
        assert await answer("m") == "1:a"
        write_model(tmp_path, "m", "VersionTwo", "2")
        write_model(tmp_path, "added", "VersionOne", "1")
        await control.poll_once()
        assert await answer("m") == "2:a"
        assert await answer("added") == "1:a"
        shutil.rmtree(tmp_path / "added")
        (tmp_path / "m" / "config.toml").write_text("max_batch_size = 'many'\n")
        with caplog.at_level(logging.WARNING, logger="batching"):
            await control.poll_once()  # a broken file changes nothing
        assert "model repository not applied" in caplog.text
        assert await answer("added") == "1:a"
        write_model(tmp_path, "m", "BrokenVersion", "3")
        await control.poll_once()  # removed: unloaded; failing: the old version stays
        assert await answer("added") == 404
        assert await answer("m") == "2:a"
        index = (await asyncio.create_task(client.post("/v2/repository/index"))).json()
        assert {
            "name": "added",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "unloaded",
        } in index
        assert {(e["name"], e["version"], e["state"]) for e in index} >= {
            ("m", "2", "READY"),
            ("m", "3", "UNAVAILABLE"),
        }


async def test_poll_mode_reads_the_repository_on_its_own(tmp_path: Path) -> None:
    versions.reset()
    write_model(tmp_path, "m", "VersionOne", "1")
    read = repository_reader(str(tmp_path), None)
    options = ControlOptions(mode="poll", poll_seconds=0.05, read_repository=read)
    app = create_app(
        [entry.config for entry in read()], model_control=options, registry=CollectorRegistry()
    )
    async with serving(app) as client:
        write_model(tmp_path, "m", "VersionTwo", "2")
        for _ in range(1000):
            described = await asyncio.create_task(client.get("/v2/models/m"))
            if described.json()["versions"] == ["2"]:
                break
            await asyncio.sleep(0.01)  # polling what an operator would poll: the metadata
        else:
            raise AssertionError("the poll never loaded version 2")


def test_rolling_a_transformers_model_forward_and_back_as_the_docs_say(tmp_path: Path) -> None:
    """docs/model-control.md's procedure with two tiny sentence-transformers folders: v1
    normalizes its embeddings, v2 does not, so each answer says which version computed it."""
    model = tmp_path / "models" / "sentiment"
    model.mkdir(parents=True)
    sentence_folder(model, "v1", normalize=True)
    sentence_folder(model, "v2", normalize=False)

    def point_at(version: str) -> None:
        # The new config.toml replaces the old one in one step, as the docs advise.
        staged = model / "config.toml.new"
        staged.write_text(
            f'source = "v{version}"\nversion = "{version}"\nengine = "torch"\n'
            'precision = "fp32"\nmax_batch_size = 4\n'
        )
        staged.replace(model / "config.toml")

    point_at("1")
    read = repository_reader(str(tmp_path / "models"), None)
    options = ControlOptions(mode="explicit", read_repository=read, apply_overrides=apply_overrides)
    app = create_app(
        [entry.config for entry in read()], model_control=options, registry=CollectorRegistry()
    )
    with serving_in_thread(app) as url:
        client = triton_http.InferenceServerClient(url.removeprefix("http://"))
        try:
            name = client.get_model_metadata("sentiment")["inputs"][0]["name"]

            def norm() -> float:
                tensor = triton_http.InferInput(name, [1, 1], "BYTES")
                tensor.set_data_from_numpy(np.array([["a cat sat"]], dtype=object))
                result = client.infer("sentiment", [tensor])
                vector = result.as_numpy(result.get_response()["outputs"][0]["name"])
                return float(np.linalg.norm(vector))

            assert norm() == pytest.approx(1.0, abs=1e-4)
            point_at("2")
            client.load_model("sentiment")
            assert client.get_model_metadata("sentiment")["versions"] == ["2"]
            assert norm() != pytest.approx(1.0, abs=1e-2)
            point_at("1")
            client.load_model("sentiment")
            assert client.get_model_metadata("sentiment")["versions"] == ["1"]
            assert norm() == pytest.approx(1.0, abs=1e-4)
        finally:
            client.close()


def test_overrides_keep_a_task_and_its_parameters_unless_they_set_them(tmp_path: Path) -> None:
    folder = str(sentence_folder(tmp_path, "tagger"))
    base = ModelConfig(
        name="tagged",
        source=folder,
        task="token-classification",
        parameters=(("ignore_labels", ("O", "MISC")),),
    )
    kept = apply_overrides(base, {"max_batch_size": 4})
    assert (kept.task, kept.parameters, kept.source) == (base.task, base.parameters, folder)
    assert kept.batching.max_batch_size == 4
    changed = apply_overrides(base, {"parameters": {"ignore_labels": ["O"]}})
    assert changed.parameters == (("ignore_labels", ("O",)),)
    with pytest.raises(InvalidRequest, match="config: parameters"):
        apply_overrides(base, {"parameters": {"no_such_parameter": 1}})
    shutil.rmtree(folder)
    with pytest.raises(InvalidRequest) as gone:
        apply_overrides(base, {"max_batch_size": 4})
    assert folder not in str(gone.value)
