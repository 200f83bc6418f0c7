"""One set of bounds for every way a model is configured: the flags, a repository's
``config.toml``, and a load call's ``config`` (read as a ``config.toml`` table is). Sizes have
fixed ceilings; instances share the instance budget (4 per core of the CPU budget, every model
together), and a count over it is refused before a single device is listed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batching import ModelConfig
from batching.core.batching_config import BatchingConfig
from batching.errors import InvalidRequest
from batching.runtime.cpus import CpuBudget, InstanceBudget
from batching.settings.cli import parse_settings
from batching.settings.reloads import apply_overrides
from batching.settings.repository import RepositoryError, load_repository

SOURCE = "tests.support.versions:VersionOne"
BUDGET = InstanceBudget(cores=2)
TWO_CORES = CpuBudget(affinity=2, quota=None)


def toml_of(table: dict[str, Any]) -> str:
    """A model's ``config.toml`` holding ``table`` (TOML's inline tables and arrays are JSON's,
    but for the keys)."""
    lines = [f'source = "{SOURCE}"']
    for key, value in table.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{key} = {{ {inner} }}")
        elif isinstance(value, list):
            groups = ", ".join(
                "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in group.items()) + " }"
                for group in value
            )
            lines.append(f"{key} = [{groups}]")
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


OVER_BOUNDS: list[dict[str, Any]] = [
    {"instance_group": [{"count": 10_000_000}]},
    {"instance_group": [{"count": 100_000}]},
    {"instance_group": [{"count": 4}, {"count": 5}]},
    {"instance_group": [{"count": 3, "kind": "gpu", "gpus": [0, 1, 2]}]},
    {"max_batch_size": 100_000_000},
    {"queue_policy": {"max_queue_size": 100_000_000}},
    {"queue_policy": {"max_items_per_request": 1_000_000}},
    {"queue_policy": {"timeout_ms": 1e300}},
    {"dynamic_batching": {"max_batch_tokens": 100_000_000}},
    {"dynamic_batching": {"max_latency_ms": 1e12}},
]


@pytest.mark.parametrize("table", OVER_BOUNDS, ids=lambda table: json.dumps(table))
def test_a_load_calls_config_is_refused_as_the_same_config_toml_is(
    tmp_path: Path, table: dict[str, Any]
) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.toml").write_text(toml_of(table), encoding="utf-8")
    with pytest.raises(RepositoryError) as at_start:
        load_repository(tmp_path, instances=BUDGET)
    base = ModelConfig(name="m", source=SOURCE)
    with pytest.raises(InvalidRequest) as at_load:
        apply_overrides(base, table, BUDGET)
    prefix = f"{tmp_path / 'm' / 'config.toml'}: "
    assert str(at_start.value).startswith(prefix)
    assert str(at_load.value) == "config: " + str(at_start.value).removeprefix(prefix)


def test_the_instance_bound_names_the_key_the_budget_and_what_the_others_take() -> None:
    base = ModelConfig(name="m", source=SOURCE)
    with pytest.raises(InvalidRequest) as caught:
        apply_overrides(base, {"instance_group": [{"count": 10_000_000}]}, BUDGET.beside(3))
    assert str(caught.value) == (
        "config: instance_group[0].count: 10000000 instances do not fit: at most 8 model "
        "instances in all (4 per core of a CPU budget of 2 cores), and the other models take "
        "3, got 10000000"
    )
    fits = apply_overrides(base, {"instance_group": [{"count": 5}]}, BUDGET.beside(3))
    assert fits.devices == ("cpu",) * 5


def test_a_repositorys_models_together_fit_the_budget(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        text = toml_of({"instance_group": [{"count": 5}]})
        (tmp_path / name / "config.toml").write_text(text, encoding="utf-8")
    with pytest.raises(RepositoryError) as caught:
        load_repository(tmp_path, instances=BUDGET)
    assert str(caught.value).startswith(
        f"{tmp_path / 'b' / 'config.toml'}: instance_group[0].count: 5 instances do not fit: "
    )
    assert "and the other models take 5, got 5" in str(caught.value)
    # A model that leaves instance_group out takes the flags' instances, counted too.
    (tmp_path / "b" / "config.toml").write_text(toml_of({}), encoding="utf-8")
    flags = ModelConfig(name="flags", devices=("cpu",) * 4)
    with pytest.raises(RepositoryError, match=r"b/config.toml: instance_group: 4 instances "):
        load_repository(tmp_path, defaults=flags, instances=BUDGET)
    assert [len(m.devices) for m in load_repository(tmp_path, instances=BUDGET)] == [5, 1]


def test_cpu_count_means_the_cores_of_the_budget(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    text = f'source = "{SOURCE}"\n[[instance_group]]\ncount = "cpu_count"\n'
    (tmp_path / "m" / "config.toml").write_text(text, encoding="utf-8")
    (model,) = load_repository(tmp_path, instances=InstanceBudget(cores=3))
    assert model.devices == ("cpu",) * 3


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--instances", "100"],
            "server.py: error: --instances 100 --device cpu: 100 instances do not fit: at most 8 "
            "model instances in all (4 per core of a CPU budget of 2 cores)\n",
        ),
        (
            ["--instances", "5", "--device", "cpu,cpu"],
            "server.py: error: --instances 5 --device cpu,cpu: 10 instances do not fit: at most "
            "8 model instances in all (4 per core of a CPU budget of 2 cores)\n",
        ),
    ],
)
def test_flags_over_the_instance_budget_stop_the_start_in_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(argv, {}, cpu_budget=TWO_CORES)
    assert exited.value.code == 2
    assert capsys.readouterr().err == says


def test_a_repository_over_the_instance_budget_stops_the_start_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "m").mkdir()
    text = toml_of({"instance_group": [{"count": 10_000_000}]})
    (tmp_path / "m" / "config.toml").write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--model-repository", str(tmp_path)], {}, cpu_budget=TWO_CORES)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "config.toml: instance_group[0].count: 10000000 instances do not fit" in err


def test_the_settings_give_model_control_the_start_ups_budget() -> None:
    settings = parse_settings(["--model-control-mode", "explicit"], {}, cpu_budget=TWO_CORES)
    assert settings.model_control.instances == InstanceBudget(cores=2)


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--max-batch-size", "5000", "max_batch_size must be between 1 and 1024, not 5000"),
        ("--max-queue-size", "100000", "max_queue_size must be between 1 and 65536"),
        ("--max-items-per-request", "100000", "max_items_per_request must be between 1 and"),
        ("--max-batch-tokens", "10000000", "max_batch_tokens must be between 1 and 1048576"),
        ("--timeout-ms", "1e12", "timeout must be a positive number of seconds, at most 86400"),
    ],
)
def test_flags_over_a_size_bound_are_refused(
    flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings([flag, value], {}, cpu_budget=TWO_CORES)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_the_ceilings_are_the_batching_configs_own() -> None:
    assert BatchingConfig(max_batch_size=1024, max_queue_size=65536).max_batch_size == 1024
    with pytest.raises(ValueError, match="max_batch_size must be between 1 and 1024"):
        BatchingConfig(max_batch_size=1025)
