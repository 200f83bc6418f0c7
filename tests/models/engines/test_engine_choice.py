"""The engine and precision choice from injected measurements, the variants the settings
allow, and the settings refused at start-up: no model runs, so these pass on any CPU."""

from __future__ import annotations

import numpy as np
import pytest

from batching.model_config import ModelConfig
from batching.models.engines import decision as decision_module
from batching.models.engines import engine_options as options_module
from batching.models.engines.accuracy import compare
from batching.models.engines.decision import Decision, Measurement, Route, decide
from batching.models.engines.engine_options import EngineConfigError, EngineOptions
from batching.models.engines.plan import EnginePlan
from batching.models.engines.variants import candidates
from batching.settings.cli import build_parser, parse_settings
from batching.settings.model_table import RepositoryError, model_from_table

CAP = 32


def measured(
    engine: str, precision: str, at_1: float, at_cap: float, memory: float = 100.0, **extra: object
) -> Measurement:
    return Measurement(engine, precision, {1: at_1, CAP: at_cap}, memory_mb=memory, **extra)  # type: ignore[arg-type]


# The figures measured offline on this repository's 2-core Xeon (README, "Engines and
# precision"), items/s of all-MiniLM-L6-v2 short texts.
TORCH = measured("torch", "fp32", 187, 704)
TORCH_BF16 = measured("torch", "bf16", 232, 1240)
ORT = measured("onnxruntime", "fp32", 533, 729)
OPENVINO_BF16 = measured("openvino", "bf16", 469, 1938)


def test_one_variant_fastest_everywhere_serves_every_batch() -> None:
    chosen = decide([TORCH, TORCH_BF16, OPENVINO_BF16], CAP)
    assert [(r.engine, r.precision, r.first, r.last) for r in chosen.routes] == [
        ("openvino", "bf16", 1, CAP)
    ]
    assert chosen.engine == "openvino" and chosen.precision == "bf16"


def test_two_engines_split_at_the_batch_size_where_their_costs_cross() -> None:
    chosen = decide([TORCH, ORT, OPENVINO_BF16], CAP)
    small, large = chosen.routes
    assert (small.engine, small.precision, small.first) == ("onnxruntime", "fp32", 1)
    assert (large.engine, large.precision, large.last) == ("openvino", "bf16", CAP)
    assert large.first == small.last + 1
    # The cost lines through the measurements cross between 1 and the cap.
    assert 1 <= small.last < CAP
    ort_time = lambda n: 1 / 533 + (n - 1) * (CAP / 729 - 1 / 533) / (CAP - 1)  # noqa: E731
    ov_time = lambda n: 1 / 469 + (n - 1) * (CAP / 1938 - 1 / 469) / (CAP - 1)  # noqa: E731
    assert ort_time(small.last) <= ov_time(small.last)
    assert ort_time(large.first) >= ov_time(large.first)
    assert chosen.engine == "onnxruntime+openvino" and chosen.precision == "fp32+bf16"
    assert chosen.route_for(1).engine == "onnxruntime"
    assert chosen.route_for(CAP).engine == "openvino"


def test_a_second_engine_that_costs_too_much_memory_is_not_kept() -> None:
    heavy = measured("openvino", "bf16", 469, 1938, memory=decision_module.SECOND_ENGINE_MAX_MB + 1)
    chosen = decide([TORCH, ORT, heavy], CAP)
    assert len(chosen.routes) == 1
    # OpenVINO's worst size (469/533 of the best) beats ONNX Runtime's (729/1938).
    assert chosen.routes[0].engine == "openvino"
    assert "MB" in chosen.reason


def test_a_second_engine_within_ten_percent_is_not_kept() -> None:
    close = measured("openvino", "fp32", 500, 1000)  # 500 * 1.1 >= 533 at batch 1
    chosen = decide([TORCH, ORT, close], CAP)
    assert [route.engine for route in chosen.routes] == ["openvino"]


def test_torch_fp32_stays_unless_another_is_clearly_faster() -> None:
    # Start-up timing is noisy: 3 % faster does not displace the reference.
    noise = measured("onnxruntime", "fp32", 187 * 1.03, 704 * 1.03)
    assert decide([TORCH, noise], CAP).routes[0].name == "torch-fp32"
    faster = measured("onnxruntime", "fp32", 187 * 1.2, 704 * 1.2)
    assert decide([TORCH, faster], CAP).routes[0].name == "onnxruntime-fp32"


def test_bf16_is_taken_only_where_faster_and_accurate() -> None:
    slower = measured("torch", "bf16", 90, 300)  # bf16 emulated: slower than fp32
    assert decide([TORCH, slower], CAP).routes[0].precision == "fp32"
    inaccurate = Measurement(
        "torch",
        "bf16",
        {1: 232, CAP: 1240},
        accuracy=0.998,
        accuracy_ok=False,
        error="failed the accuracy check: min cosine 0.998",
    )
    assert decide([TORCH, inaccurate], CAP).routes[0].precision == "fp32"
    assert decide([TORCH, TORCH_BF16], CAP).routes[0].precision == "bf16"


def test_failed_variants_stay_in_the_record_but_are_never_chosen() -> None:
    broken = Measurement("onnxruntime", "fp32", error="RuntimeError: export failed")
    chosen = decide([TORCH, broken], CAP)
    assert chosen.routes[0].name == "torch-fp32"
    assert [m.name for m in chosen.measurements] == ["torch-fp32", "onnxruntime-fp32"]
    record = chosen.to_json()
    assert record["measurements"][1]["error"] == "RuntimeError: export failed"
    assert Decision.from_json(record) == chosen


def test_nothing_usable_is_an_error_for_the_caller_to_fall_back_on() -> None:
    with pytest.raises(ValueError):
        decide([Measurement("openvino", "bf16", error="no bf16 here")], CAP)


def test_one_batch_size_means_one_variant() -> None:
    chosen = decide(
        [Measurement("torch", "fp32", {1: 10.0}), Measurement("openvino", "fp32", {1: 30.0})], 1
    )
    assert [(route.name, route.last) for route in chosen.routes] == [("openvino-fp32", 1)]


def test_the_plan_sends_each_batch_to_its_route() -> None:
    chosen = Decision((Route("onnxruntime", "fp32", 1, 4), Route("openvino", "bf16", 5, 8)), "test")
    plan = EnginePlan(
        chosen,
        {
            "onnxruntime-fp32": lambda batch: ("ort", len(batch["ids"])),
            "openvino-bf16": lambda batch: ("ov", len(batch["ids"])),
        },
    )
    assert plan({"ids": [0] * 4}) == ("ort", 4)
    assert plan({"ids": [0] * 5}) == ("ov", 5)
    assert plan.describe()["routes"][1] == {
        "engine": "openvino",
        "precision": "bf16",
        "batch_sizes": [5, 8],
    }
    with pytest.raises(ValueError, match="no runner"):
        EnginePlan(chosen, {})


# -- the variants the settings allow ------------------------------------------------------


def test_variants_follow_the_engine_and_precision_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options_module, "installed", lambda engine: True)
    from batching.models.engines import variants

    monkeypatch.setattr(variants, "installed", lambda engine: True)
    everything = candidates(EngineOptions(), gpu=False, measurable=True)
    assert everything == [
        ("torch", "fp32"),
        ("torch", "bf16"),
        ("onnxruntime", "fp32"),
        ("openvino", "fp32"),
        ("openvino", "bf16"),
    ]
    assert candidates(EngineOptions(engine="openvino"), gpu=False, measurable=True) == [
        ("openvino", "fp32"),
        ("openvino", "bf16"),
    ]
    assert candidates(EngineOptions(precision="bf16"), gpu=False, measurable=True) == [
        ("torch", "bf16"),
        ("openvino", "bf16"),
    ]
    assert candidates(EngineOptions(), gpu=True, measurable=True) == [
        ("torch", "fp32"),
        ("torch", "bf16"),
    ]
    assert candidates(EngineOptions(precision="fp16"), gpu=True, measurable=True) == [
        ("torch", "fp16")
    ]
    # A task without an accuracy measure runs torch fp32, unmeasured.
    assert candidates(EngineOptions(), gpu=False, measurable=False) == [("torch", "fp32")]


def test_without_the_engines_installed_auto_weighs_torch_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from batching.models.engines import variants

    monkeypatch.setattr(variants, "installed", lambda engine: engine == "torch")
    assert candidates(EngineOptions(), gpu=False, measurable=True) == [
        ("torch", "fp32"),
        ("torch", "bf16"),
    ]
    assert candidates(EngineOptions(precision="fp32"), gpu=False, measurable=True) == [
        ("torch", "fp32")
    ]


# -- settings refused at start-up, in one line --------------------------------------------


def test_fp16_on_a_cpu_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse_settings(["--precision", "fp16"], {})
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "server.py: error: precision fp16 runs on a GPU only (--device cuda); on a CPU use "
        "bf16, fp32 or auto"
    ]


def test_an_engine_not_installed_is_refused_with_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(options_module, "installed", lambda engine: engine == "torch")
    with pytest.raises(SystemExit) as stopped:
        parse_settings(["--engine", "openvino"], {})
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "server.py: error: engine openvino is not installed: pip install openvino onnx"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"engine": "onnxruntime", "precision": "bf16"}, "onnxruntime runs fp32 here"),
        ({"engine": "openvino", "devices": ("cuda:0",)}, "runs on the CPU here"),
        ({"engine": "onnxruntime", "source": "tests.support.models:EchoModel"}, "its own code"),
        ({"engine": "nope"}, "engine must be one of auto, torch, onnxruntime, openvino"),
    ],
)
def test_settings_an_engine_cannot_serve_are_refused(settings: dict, message: str) -> None:
    with pytest.raises(EngineConfigError, match=message):
        ModelConfig(name="m", **settings)


def test_the_flags_reach_the_model_configuration(tmp_path: object) -> None:
    settings = parse_settings(
        ["--engine", "torch", "--precision", "fp32", "--engine-cache", "/tmp/x"], {}
    )
    (model,) = settings.models
    assert (model.engine, model.precision, model.engine_cache) == ("torch", "fp32", "/tmp/x")
    options = model.engine_options
    assert options.batch_sizes == (1, 32) and options.cache_dir == "/tmp/x"
    env = parse_settings([], {"BATCHING_ENGINE": "onnxruntime", "BATCHING_PRECISION": "fp32"})
    assert (env.models[0].engine, env.models[0].precision) == ("onnxruntime", "fp32")
    assert "--engine-cache" in build_parser({}).format_help()


def test_the_repository_keys(tmp_path: object) -> None:
    from pathlib import Path

    folder = Path(str(tmp_path))
    model = model_from_table(
        {"engine": "openvino", "precision": "bf16"}, file="c.toml", folder=folder, default_name="m"
    )
    assert (model.engine, model.precision) == ("openvino", "bf16")
    inherited = model_from_table(
        {},
        file="c.toml",
        folder=folder,
        default_name="m",
        defaults=ModelConfig(name="d", engine="torch"),
    )
    assert inherited.engine == "torch"
    with pytest.raises(RepositoryError, match=r"c.toml: precision: must be one of"):
        model_from_table({"precision": "int4"}, file="c.toml", folder=folder, default_name="m")


# -- the accuracy check --------------------------------------------------------------------


def test_embeddings_must_keep_a_cosine_of_0_9999() -> None:
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(4, 16))
    assert compare("embedding", reference, reference * 3).ok  # scale does not matter
    noisy = reference + rng.normal(scale=0.05, size=reference.shape)
    result = compare("embedding", reference, noisy)
    assert not result.ok and result.figure < 0.9999


def test_classification_needs_the_same_labels_and_scores_within_1e_3() -> None:
    reference = np.array([[0.7, 0.3], [0.4, 0.6]])
    assert compare("classification", reference, reference + 5e-4).ok
    assert not compare("classification", reference, reference + 2e-3).ok
    swapped = np.array([[0.7, 0.3], [0.6, 0.4]])
    assert "different labels" in compare("classification", reference, swapped).text


def test_fill_mask_needs_the_same_top_k_in_order() -> None:
    reference = np.array([[9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 0.0]])
    assert compare("fill-mask", reference, reference + 0.01).ok
    reordered = np.array([[8.0, 9.0, 7.0, 6.0, 5.0, 4.0, 0.0]])
    assert not compare("fill-mask", reference, reordered).ok
    # Below the top 5, order does not matter.
    assert compare("fill-mask", reference, np.array([[9.0, 8.0, 7.0, 6.0, 5.0, 0.0, 4.0]])).ok


def test_non_finite_outputs_never_pass() -> None:
    reference = np.ones((2, 3))
    broken = reference.copy()
    broken[1, 1] = np.nan
    assert not compare("embedding", reference, broken).ok


def test_timing_takes_the_median_within_a_time_budget() -> None:
    from batching.models.engines import measure

    calls: list[int] = []
    assert measure.items_per_second(lambda: calls.append(1), 8, repeats=3, budget_s=10) > 0
    assert len(calls) == 4  # one untimed run, then three timed
    slow: list[int] = []
    measure.items_per_second(lambda: slow.append(1), 8, repeats=3, budget_s=0.0)
    assert len(slow) == 2  # over budget after the first timed run: no more
