"""The model repository: its two forms, every validation message, instance groups, the
command line, and two models from one repository served side by side."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from batching import BatchingConfig, ModelConfig, create_app
from batching.models import DEFAULT_MODEL_NAME
from batching.settings.cli import parse_settings
from batching.settings.repository import RepositoryError, load_repository
from tests.support.asgi import serving
from tests.support.metrics import sample

ROOT = Path(__file__).resolve().parents[2]

FULL = """\
name = "echo"
source = "tests.support.models:EchoModel"
version = 3
max_batch_size = 2

[dynamic_batching]
max_queue_delay_ms = 5
preferred_batch_size = [2]
policy = "adaptive"
max_latency_ms = 50
max_batch_tokens = 512

[queue_policy]
max_queue_size = 100
timeout_ms = 2000
max_items_per_request = 10

[[instance_group]]
count = 2
kind = "cpu"
execution = "process"

[warmup]
batch_sizes = [1, 2]
data = "zero"
"""

FULL_CONFIG = ModelConfig(
    name="echo",
    source="tests.support.models:EchoModel",
    devices=("cpu", "cpu"),
    instance_kind="process",
    version="3",
    batching=BatchingConfig(
        max_batch_size=2,
        max_queue_delay=0.005,
        preferred_batch_sizes=(2,),
        max_batch_tokens=512,
        policy="adaptive",
        max_latency=0.05,
        max_queue_size=100,
        timeout=2.0,
        max_items_per_request=10,
    ),
    warmup_batch_sizes=(1, 2),
    warmup_data="zero",
)

COST = 'source = "tests.support.models:CostModel"\nmax_batch_size = 8\n'


def make_repository(root: Path, models: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for folder, text in models.items():
        (root / folder).mkdir()
        (root / folder / "config.toml").write_text(text, encoding="utf-8")
    return root


def test_a_directory_holds_one_model_per_folder_in_folder_order(tmp_path: Path) -> None:
    root = make_repository(tmp_path / "models", {"b-echo": FULL, "a-cost": COST})
    cost, echo = load_repository(root)
    assert echo == FULL_CONFIG
    assert cost == ModelConfig(
        name="a-cost",
        source="tests.support.models:CostModel",
        batching=BatchingConfig(max_batch_size=8),
    )


def test_a_single_file_holds_one_table_per_model_in_file_order(tmp_path: Path) -> None:
    file = tmp_path / "models.toml"
    file.write_text(
        f"""\
[models.cost]
{COST}
[models.echo]
source = "tests.support.models:EchoModel"
version = 3
max_batch_size = 2

[models.echo.dynamic_batching]
max_queue_delay_ms = 5
preferred_batch_size = [2]
policy = "adaptive"
max_latency_ms = 50
max_batch_tokens = 512

[models.echo.queue_policy]
max_queue_size = 100
timeout_ms = 2000
max_items_per_request = 10

[[models.echo.instance_group]]
count = 2
kind = "cpu"
execution = "process"

[models.echo.warmup]
batch_sizes = [1, 2]
data = "zero"
""",
        encoding="utf-8",
    )
    cost, echo = load_repository(file)
    assert echo == FULL_CONFIG
    assert (cost.name, cost.source, cost.batching.max_batch_size) == (
        "cost",
        "tests.support.models:CostModel",
        8,
    )


def test_a_model_without_config_is_the_default_model(tmp_path: Path) -> None:
    root = make_repository(tmp_path / "models", {"minilm": "", "named": 'source = "default"\n'})
    assert load_repository(root) == (
        ModelConfig(name="minilm"),
        ModelConfig(name="named"),
    )
    # And with no repository at all, the default model is served with no configuration.
    assert parse_settings([], {}).models == (ModelConfig(name=DEFAULT_MODEL_NAME),)


def test_sources_resolve_against_the_models_folder(tmp_path: Path) -> None:
    root = make_repository(
        tmp_path / "models",
        {
            "hf": "",
            "weights": 'source = "weights"\ntask = "text-classification"\n',
            "absolute": f"source = {str(tmp_path / 'elsewhere')!r}\n",
        },
    )
    # What each folder must hold to be served: a config.json, and a modules.json where no
    # task says what the model does (a sentence-transformers folder).
    for folder in (root / "hf", root / "weights" / "weights", tmp_path / "elsewhere"):
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text("{}", encoding="utf-8")
    for folder in (root / "hf", tmp_path / "elsewhere"):
        (folder / "modules.json").write_text("[]", encoding="utf-8")
    absolute, hf, weights = load_repository(root)
    assert hf.source == str((root / "hf").resolve())  # the folder is the model
    assert (weights.source, weights.task) == (
        str((root / "weights" / "weights").resolve()),
        "text-classification",
    )
    assert absolute.source == str((tmp_path / "elsewhere").resolve())


def test_a_warmup_file_resolves_against_the_models_folder(tmp_path: Path) -> None:
    root = make_repository(tmp_path / "models", {"echo": '[warmup]\nfile = "samples.txt"\n'})
    (root / "echo" / "samples.txt").write_text("a\n", encoding="utf-8")
    (echo,) = load_repository(root)
    assert (echo.warmup_data, echo.warmup_file) == (
        "file",
        str((root / "echo" / "samples.txt").resolve()),
    )


@pytest.mark.parametrize(
    ("groups", "devices", "kind"),
    [
        ("", ("cpu",), "thread"),
        ("[[instance_group]]\n", ("cpu",), "thread"),
        ('[[instance_group]]\ncount = 3\nkind = "cpu"\n', ("cpu",) * 3, "thread"),
        (
            '[[instance_group]]\ncount = 2\nkind = "gpu"\ngpus = [0, 1]\n',
            ("cuda:0", "cuda:0", "cuda:1", "cuda:1"),
            "thread",
        ),
        ('[[instance_group]]\nkind = "gpu"\n', ("cuda:0",), "thread"),
        ('[[instance_group]]\ncount = "cpu_count"\n', ("cpu",) * (os.cpu_count() or 1), "thread"),
        (
            '[[instance_group]]\n[[instance_group]]\nkind = "gpu"\ngpus = [1]\ncount = 2\n',
            ("cpu", "cuda:1", "cuda:1"),
            "thread",
        ),
        (
            '[[instance_group]]\nexecution = "process"\n'
            '[[instance_group]]\nexecution = "process"\nkind = "gpu"\n',
            ("cpu", "cuda:0"),
            "process",
        ),
    ],
)
def test_instance_groups_become_devices(
    tmp_path: Path, groups: str, devices: tuple[str, ...], kind: str
) -> None:
    (model,) = load_repository(make_repository(tmp_path / "m", {"echo": groups}))
    assert (model.devices, model.instance_kind) == (devices, kind)


MAX = "max_batch_size = 32\n"

BAD_CONFIGS = [
    ("max_batch_size = 0\n", "max_batch_size: must be an integer between 1 and 1024, got 0"),
    ("max_batch_size = true\n", "max_batch_size: must be an integer between 1 and 1024, got true"),
    ('max_batch_size = "8"\n', 'max_batch_size: must be an integer between 1 and 1024, got "8"'),
    ("batch_size = 4\n", "batch_size: unknown key (known here: name, source,"),
    ('name = "a/b"\n', "name: must be letters, digits, "),
    ('version = ""\n', "version: must be a non-empty string without '/', got \"\""),
    ("source = 3\n", "source: must be a non-empty string, got 3"),
    ('source = "no/such/folder"\n', 'source: must be "default", a model folder (looked for'),
    ('source = "no_such_module_xyz:Model"\n', "source: cannot import module 'no_such_module_xyz'"),
    ('task = "fill-mask"\n', 'task: applies only when source is a model folder, got "fill-mask"'),
    ("dynamic_batching = 3\n", "dynamic_batching: must be a table ([dynamic_batching]), got 3"),
    (
        "[dynamic_batching]\nmax_queue_delay_ms = -1\n",
        "dynamic_batching.max_queue_delay_ms: must be a number >= 0, got -1",
    ),
    (
        '[dynamic_batching]\nmax_queue_delay_ms = "2"\n',
        'dynamic_batching.max_queue_delay_ms: must be a number >= 0, got "2"',
    ),
    (
        "[dynamic_batching]\nmax_queue_delay_ms = nan\n",
        "dynamic_batching.max_queue_delay_ms: must be a number >= 0, got nan",
    ),
    (
        "[dynamic_batching]\nmax_delay = 1\n",
        "dynamic_batching.max_delay: unknown key (known here: max_queue_delay_ms,",
    ),
    (
        MAX + "[dynamic_batching]\npreferred_batch_size = [4, 64]\n",
        "dynamic_batching.preferred_batch_size: every size must be between 1 and "
        "max_batch_size (32), got [4, 64]",
    ),
    (
        "[dynamic_batching]\npreferred_batch_size = 8\n",
        "dynamic_batching.preferred_batch_size: must be a list of integers, got 8",
    ),
    (
        '[dynamic_batching]\npolicy = "greedy"\n',
        'dynamic_batching.policy: must be one of "fixed", "adaptive", got "greedy"',
    ),
    (
        "[dynamic_batching]\nmax_latency_ms = 0\n",
        "dynamic_batching.max_latency_ms: must be a number > 0 and at most 86400000, got 0",
    ),
    (
        "[dynamic_batching]\nmax_batch_tokens = 0\n",
        "dynamic_batching.max_batch_tokens: must be an integer between 1 and 1048576, got 0",
    ),
    (
        "[dynamic_batching]\nmax_queue_delay_ms = 500\n[queue_policy]\ntimeout_ms = 100\n",
        "dynamic_batching.max_queue_delay_ms: must be below the request timeout (100 ms), got 500",
    ),
    (
        "[queue_policy]\ntimeout_ms = 1\n",
        "queue_policy.timeout_ms: must be above the batch window (2 ms), got 1",
    ),
    (
        "[queue_policy]\nmax_queue_size = 0\n",
        "queue_policy.max_queue_size: must be an integer between 1 and 65536, got 0",
    ),
    (
        "[queue_policy]\ntimeout_ms = -5\n",
        "queue_policy.timeout_ms: must be a number > 0 and at most 86400000, got -5",
    ),
    (
        "[queue_policy]\nmax_items_per_request = 1.5\n",
        "queue_policy.max_items_per_request: must be an integer between 1 and 65536, got 1.5",
    ),
    (
        "[queue_policy]\ndefault_timeout = 1\n",
        "queue_policy.default_timeout: unknown key",
    ),
    (
        "[instance_group]\ncount = 1\n",
        "instance_group: must be an array of tables ([[instance_group]])",
    ),
    ("instance_group = []\n", "instance_group: needs at least one group"),
    (
        "[[instance_group]]\ncount = 0\n",
        'instance_group[0].count: must be an integer >= 1 or "cpu_count", got 0',
    ),
    (
        '[[instance_group]]\nkind = "tpu"\n',
        'instance_group[0].kind: must be one of "cpu", "gpu", got "tpu"',
    ),
    (
        '[[instance_group]]\nkind = "gpu"\ngpus = []\n',
        "instance_group[0].gpus: must be a non-empty list of integers >= 0, got []",
    ),
    (
        '[[instance_group]]\nkind = "gpu"\ngpus = [-1]\n',
        "instance_group[0].gpus: must be a non-empty list of integers >= 0, got [-1]",
    ),
    (
        "[[instance_group]]\ngpus = [0]\n",
        'instance_group[0].gpus: applies to kind = "gpu" only, got [0]',
    ),
    (
        '[[instance_group]]\nkind = "gpu"\ncount = "cpu_count"\n',
        'instance_group[0].count: "cpu_count" applies to kind = "cpu" only',
    ),
    (
        '[[instance_group]]\nexecution = "fiber"\n',
        'instance_group[0].execution: must be one of "thread", "process", got "fiber"',
    ),
    (
        '[[instance_group]]\n[[instance_group]]\nexecution = "process"\n',
        "instance_group[1].execution: every group of a model must run the same way, and "
        'group 0 says "thread", got "process"',
    ),
    (
        "[[instance_group]]\ncores = 2\n",
        "instance_group[0].cores: unknown key (known here: count, kind, gpus, execution)",
    ),
    (
        MAX + "[warmup]\nbatch_sizes = [64]\n",
        "warmup.batch_sizes: every size must be between 1 and max_batch_size (32), got [64]",
    ),
    (
        '[warmup]\ndata = "noise"\n',
        'warmup.data: must be one of "model", "zero", "random", "file", got "noise"',
    ),
    ('[warmup]\ndata = "file"\n', 'warmup.file: is needed with data = "file"'),
    ('[warmup]\nfile = "missing.txt"\n', "warmup.file: no such file ("),
    (
        '[warmup]\ndata = "zero"\nfile = "config.toml"\n',
        'warmup.file: applies to data = "file" only, not "zero"',
    ),
    ("max_batch_size = \n", "not valid TOML: "),
]


def _case_id(case: tuple[str, str]) -> str:
    return case[1].split(":")[0]


@pytest.mark.parametrize(("text", "message"), BAD_CONFIGS, ids=map(_case_id, BAD_CONFIGS))
def test_a_bad_config_names_the_file_and_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    make_repository(Path("models"), {"minilm": text})
    with pytest.raises(RepositoryError) as caught:
        load_repository("models")
    assert str(caught.value).startswith(f"models/minilm/config.toml: {message}")


SINGLE_FILE_CASES = [
    (text, message)
    for text, message in BAD_CONFIGS
    if "instance_group" not in text
    and "warmup" not in text
    and "([" not in message
    and "TOML" not in message
]


@pytest.mark.parametrize(
    ("text", "message"), SINGLE_FILE_CASES, ids=map(_case_id, SINGLE_FILE_CASES)
)
def test_a_bad_table_in_a_single_file_names_its_dotted_path(
    tmp_path: Path, text: str, message: str
) -> None:
    body = text.replace("[dynamic_batching]", "[models.m.dynamic_batching]")
    body = body.replace("[queue_policy]", "[models.m.queue_policy]")
    file = tmp_path / "models.toml"
    if body.startswith("[models.m."):
        file.write_text(body, encoding="utf-8")
    else:
        file.write_text(f"[models.m]\n{body}", encoding="utf-8")
    with pytest.raises(RepositoryError) as caught:
        load_repository(file)
    assert str(caught.value).startswith(f"{file}: models.m.{message}")


def test_the_brief_example_message_word_for_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    make_repository(Path("models"), {"minilm": "[dynamic_batching]\nmax_queue_delay_ms = -1\n"})
    with pytest.raises(ValueError) as caught:
        load_repository("models")
    assert str(caught.value) == (
        "models/minilm/config.toml: dynamic_batching.max_queue_delay_ms: "
        "must be a number >= 0, got -1"
    )


def test_repository_level_mistakes_are_named(tmp_path: Path) -> None:
    def error_of(path: Path) -> str:
        with pytest.raises(RepositoryError) as caught:
            load_repository(path)
        return str(caught.value)

    empty = tmp_path / "empty"
    empty.mkdir()
    assert error_of(empty) == f"{empty}: no models (add a folder with a config.toml per model)"
    (empty / ".git").mkdir()  # hidden folders are not models
    (empty / "__pycache__").mkdir()
    assert "no models" in error_of(empty)
    (empty / "loose").mkdir()
    assert error_of(empty).startswith(f"{empty / 'loose'}: no config.toml")

    twins = make_repository(tmp_path / "twins", {"a": 'name = "x"\n', "b": 'name = "x"\n'})
    assert error_of(twins) == (
        f'{twins / "b" / "config.toml"}: name: "x" is already the name of the model in '
        f"{twins / 'a' / 'config.toml'}"
    )
    one_model = make_repository(tmp_path / "one", {"m": ""}) / "m"
    assert "point at the folder above it" in error_of(one_model)
    assert error_of(tmp_path / "nowhere") == f"{tmp_path / 'nowhere'}: no such directory or file"
    text = tmp_path / "models.txt"
    text.write_text("", encoding="utf-8")
    assert "a directory or a .toml file" in error_of(text)
    stray = tmp_path / "stray.toml"
    stray.write_text("[models.a]\n[other]\nx = 1\n", encoding="utf-8")
    assert error_of(stray).startswith(f"{stray}: other: unknown key")
    no_models = tmp_path / "none.toml"
    no_models.write_text("", encoding="utf-8")
    assert error_of(no_models) == f"{no_models}: no models (add a [models.<name>] table per model)"


# ------------------------------------------------------------------------- command line


def test_command_line_flags_are_defaults_for_keys_a_model_leaves_out(tmp_path: Path) -> None:
    root = make_repository(tmp_path / "models", {"a": "", "b": "max_batch_size = 4\n"})
    settings = parse_settings(
        ["--max-batch-size", "16", "--instances", "2", "--instance-kind", "process"],
        {"BATCHING_MODEL_REPOSITORY": str(root)},
    )
    a, b = settings.models
    assert (a.name, a.batching.max_batch_size, a.devices, a.instance_kind) == (
        "a",
        16,
        ("cpu", "cpu"),
        "process",
    )
    assert (b.name, b.batching.max_batch_size) == ("b", 4)


def test_single_model_flags_cannot_join_a_repository(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_repository(tmp_path / "models", {"a": ""})
    with pytest.raises(SystemExit) as caught:
        parse_settings(["--model-repository", str(root), "--model", "x:Y", "--name", "n"], {})
    assert caught.value.code == 2
    assert "--model, --name cannot be combined with --model-repository" in capsys.readouterr().err


def test_a_bad_repository_stops_the_server_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    root = make_repository(tmp_path / "models", {"m": "[queue_policy]\nmax_queue_size = -3\n"})
    done = subprocess.run(
        [sys.executable, str(ROOT / "server.py"), "--model-repository", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"server.py: error: {root / 'm' / 'config.toml'}: queue_policy.max_queue_size: "
        "must be an integer between 1 and 65536, got -3\n"
    )


# ------------------------------------------------------------------- two models, one app


@pytest.mark.anyio
async def test_two_models_from_one_repository_batch_by_their_own_settings(
    tmp_path: Path,
) -> None:
    root = make_repository(
        tmp_path / "models",
        {
            "first": 'source = "tests.support.models:EchoModel"\nmax_batch_size = 2\n',
            "second": COST + "[queue_policy]\nmax_items_per_request = 3\n",
        },
    )
    app = create_app(load_repository(root))
    async with serving(app) as client:
        default = await client.post("/", json={"inputs": ["a", "b", "c", "d", "e"]})
        second = await client.post("/models/second", json={"inputs": ["a", "b", "c"]})
        too_many = await client.post("/models/second", json={"inputs": ["a", "b", "c", "d"]})
        accepted_by_first = await client.post("/models/first", json={"inputs": ["a"] * 4})
        metrics = (await client.get("/metrics")).text
    assert default.status_code == second.status_code == accepted_by_first.status_code == 200
    assert default.json()["model"] == "first"  # the first folder answers POST /
    assert [out["input"] for out in default.json()["outputs"]] == ["a", "b", "c", "d", "e"]
    assert too_many.status_code == 413  # second's own queue policy; first took 4 at once
    # first split 5 + 4 items into batches of at most 2; second ran its 3 items at once.
    assert sample(metrics, "batching_batch_size_items_count", model="first") == 5
    assert sample(metrics, "batching_batch_size_items_sum", model="first") == 9
    assert sample(metrics, "batching_batch_size_items_count", model="second") == 1


def test_the_documented_example_repository_parses(tmp_path: Path) -> None:
    # docs/model-repository.md shows a complete config.toml; it must stay valid.
    text = (ROOT / "docs" / "model-repository.md").read_text(encoding="utf-8")
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    example = example.replace('source = "default"', 'source = "tests.support.models:EchoModel"')
    (model,) = load_repository(make_repository(tmp_path / "models", {"minilm": example}))
    assert model.name == "minilm"
    assert isinstance(model, ModelConfig)
