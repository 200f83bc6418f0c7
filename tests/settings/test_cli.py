"""Command-line settings: flags, their BATCHING_* twins, validation, torch thread shares."""

from __future__ import annotations

import pytest

from batching.model_config import ModelConfig
from batching.runtime.cpus import CpuBudget
from batching.settings.cli import build_parser, parse_settings
from batching.settings.engines import torch_threads_for

FLAGS = [
    "--host",
    "--port",
    "--model",
    "--task",
    "--device",
    "--instances",
    "--max-batch-size",
    "--max-queue-delay-ms",
    "--max-queue-size",
    "--timeout-ms",
    "--batching",
    "--max-latency-ms",
    "--max-batch-tokens",
    "--preferred-batch-sizes",
    "--instance-kind",
    "--model-repository",
    "--torch-threads",
    "--api-key",
    "--api-key-file",
    "--admin-api-key",
    "--admin-api-key-file",
    "--model-control-mode",
]


def test_every_flag_has_help_naming_its_environment_twin() -> None:
    text = build_parser({}).format_help()
    for flag in FLAGS:
        assert flag in text
        twin = "BATCHING_" + flag.lstrip("-").replace("-", "_").upper()
        assert twin in text


def test_flags_and_defaults() -> None:
    settings = parse_settings(
        [
            "--port",
            "9000",
            "--max-batch-size",
            "16",
            "--max-queue-delay-ms",
            "3.5",
            "--instances",
            "2",
            "--timeout-ms",
            "1500",
            "--batching",
            "adaptive",
        ],
        {},
    )
    (model,) = settings.models
    assert settings.port == 9000 and settings.host == "127.0.0.1"
    assert model.name == "all-MiniLM-L6-v2" and model.source is None
    assert model.devices == ("cpu", "cpu")
    assert model.batching.max_batch_size == 16
    assert model.batching.max_queue_delay == pytest.approx(0.0035)
    assert model.batching.timeout == pytest.approx(1.5)
    assert model.batching.policy == "adaptive"


def test_environment_twins_set_defaults_and_flags_win() -> None:
    environ = {"BATCHING_MAX_BATCH_SIZE": "8", "BATCHING_PORT": "7000"}
    assert parse_settings([], environ).models[0].batching.max_batch_size == 8
    assert parse_settings(["--port", "7001"], environ).port == 7001


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-batch-size", "0"], "max_batch_size"),
        (["--instances", "zero"], "--instances"),
        (["--preferred-batch-sizes", "4,x"], "--preferred-batch-sizes"),
        (["--batching", "magic"], "invalid choice"),
        (["--torch-threads", "0"], "--torch-threads"),
        (["--max-queue-delay-ms", "-1"], "max_queue_delay"),
    ],
)
def test_bad_flags_exit_with_a_message_naming_them(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(argv, {})
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("devices", "kinds", "cores", "asked", "threads"),
    [
        ([("cpu",)], ["thread"], 2, "auto", 2),
        # Thread instances, of one model or several, share this process's cores batch by
        # batch (batching.models.engines.cores): each may use them all.
        ([("cpu", "cpu")], ["thread"], 2, "auto", 2),
        ([("cpu", "cpu", "cpu")], ["thread"], 2, "auto", 2),
        ([("cpu",), ("cpu",)], ["thread", "thread"], 8, "auto", 8),
        # Each process instance has a team of its own: the cores are divided.
        ([("cpu", "cpu")], ["process"], 2, "auto", 1),
        ([("cpu", "cpu")], ["process"], 8, "auto", 4),
        ([("cpu",), ("cpu", "cpu")], ["thread", "process"], 8, "auto", 2),
        ([("cpu", "cpu", "cpu")], ["process"], 2, "auto", 1),
        ([("cuda:0", "cuda:1")], ["thread"], 8, "auto", 8),
        ([("cpu", "cpu")], ["thread"], 2, "3", 3),
    ],
)
def test_torch_threads_share_the_cores_among_this_process_and_the_process_instances(
    devices: list[tuple[str, ...]], kinds: list[str], cores: int, asked: str, threads: int
) -> None:
    models = [
        ModelConfig(name=f"m{i}", devices=d, instance_kind=kind)
        for i, (d, kind) in enumerate(zip(devices, kinds, strict=True))
    ]
    assert torch_threads_for(models, cores, asked) == threads


@pytest.mark.parametrize(
    ("argv", "environ", "cores", "threads"),
    [
        # auto: the machine's cores, which thread instances share batch by batch, and
        # process instances divide among them.
        (["--instances", "2"], {}, 8, 8),
        (["--instances", "2"], {}, 2, 2),
        (["--instances", "3"], {}, 8, 8),
        (["--instances", "2", "--instance-kind", "process"], {}, 8, 4),
        ([], {}, 6, 6),
        # An operator's OMP_NUM_THREADS wins over auto, even where auto would differ.
        (["--instances", "2"], {"OMP_NUM_THREADS": "3"}, 8, 3),
        (["--instances", "2"], {"OMP_NUM_THREADS": "3"}, 2, 3),
        # ... but not over an explicit --torch-threads, nor when it is not a number.
        (["--instances", "2", "--torch-threads", "5"], {"OMP_NUM_THREADS": "3"}, 8, 5),
        (["--instances", "2"], {"OMP_NUM_THREADS": "many"}, 8, 8),
    ],
)
def test_parse_settings_shares_the_machines_cores_unless_the_operator_chose(
    argv: list[str],
    environ: dict[str, str],
    cores: int,
    threads: int,
) -> None:
    # The budget is injected, so no result depends on this machine.
    budget = CpuBudget(affinity=cores, quota=None)
    assert parse_settings(argv, environ, budget).torch_threads == threads


@pytest.mark.parametrize(
    ("argv", "environ", "says"),
    [
        (["--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
        (["--batching", "magic"], {}, "argument --batching: invalid choice"),
        (["--port", "eighty"], {}, "argument --port: invalid int value"),
        (["--grpc-port", "70000"], {}, "--grpc-port must be a port number"),
        (["--max-batch-size", "0"], {}, "max_batch_size"),
        (["--instances", "zero"], {}, "--instances must be a number or cpu_count"),
        (["--header-timeout-s", "-1"], {}, "header_timeout must be >= 0"),
        (["--torch-threads", "0"], {}, "--torch-threads must be >= 1"),
        (["--cors-allow-origin", "a.example"], {}, "--cors-allow-origin: 'a.example'"),
        (["--repository-poll-secs", "0"], {}, "--repository-poll-secs: "),
        (["--model-control-mode", "poll"], {}, "it needs --model-repository"),
        (["--otlp-protocol", "pigeon"], {}, "pigeon"),
        ([], {"BATCHING_NO_TRUNCATE": "maybe"}, "BATCHING_NO_TRUNCATE must be 1 or 0"),
        ([], {"BATCHING_MAX_QUEUE_SIZE": "many"}, "argument --max-queue-size: invalid int"),
    ],
)
def test_every_bad_setting_of_every_group_exits_2_with_one_line(
    argv: list[str], environ: dict[str, str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(argv, environ)
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error  # one line: no usage text to bury it
    assert error.startswith("server.py: error: ") and says in error
