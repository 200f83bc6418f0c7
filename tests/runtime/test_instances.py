"""Instances: warm-up plans, instance indices, parallel instances, and process instances
(end to end through the app, crashes, restarts)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from batching import BatchingConfig, ModelConfig, create_app
from batching.core.jobs import InstanceLost
from batching.runtime.deployment import instance_factory_for
from batching.runtime.process import ProcessInstance
from batching.runtime.threads import ThreadInstance
from batching.runtime.warmup import (
    DEFAULT_WARMUP_WORDS,
    WarmupPlan,
    load_and_warm,
    warmup_inputs_for,
)
from batching.settings.repository import load_repository
from tests.support.asgi import serving, wait_until_ready
from tests.support.models import EchoModel
from tests.support.process_models import PidModel

pytestmark = pytest.mark.anyio

PID_MODEL = "tests.support.process_models:PidModel"


# ------------------------------------------------------------------------ warm-up plans


class SampledModel(EchoModel):
    """Echo with its own warm-up samples, recording every batch and its load call."""

    max_seq_length = 7

    def __init__(self, sample: str = "sample") -> None:
        super().__init__()
        self.sample = sample
        self.index = -1

    def load(self, device: str, instance_index: int = 0) -> None:
        super().load(device)
        self.index = instance_index

    def warmup_inputs(self, max_batch_size: int) -> list[list[Any]]:
        return [[self.sample], [self.sample] * max_batch_size]


class TensorModel(EchoModel):
    """Takes fixed-shape numbers, as its metadata says."""

    def __init__(self, datatype: str = "FP32", shape: Sequence[int] = (-1, 3)) -> None:
        super().__init__()
        self.spec = {"name": "x", "datatype": datatype, "shape": list(shape)}

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        self.batches.append(list(inputs))
        return [0] * len(inputs)

    def metadata(self) -> dict[str, Any]:
        return {"inputs": [self.spec], "outputs": []}


def test_by_default_an_instance_runs_the_models_own_warmup_batches() -> None:
    model = SampledModel()
    info = load_and_warm(model, "cpu", 4)
    assert model.batches == [["sample"], ["sample"] * 4]
    assert info.warmup_batches == 2


def test_listed_warmup_sizes_reuse_the_models_sample() -> None:
    model = SampledModel()
    load_and_warm(model, "cpu", 8, warmup=WarmupPlan(batch_sizes=(3, 5)))
    assert model.batches == [["sample"] * 3, ["sample"] * 5]


def test_a_model_without_samples_gets_no_model_warmup() -> None:
    model = EchoModel()
    info = load_and_warm(model, "cpu", 8)
    assert model.batches == [] and info.warmup_batches == 0


@pytest.mark.parametrize(
    ("model", "plan", "expected"),
    [
        # Text models: empty texts, or the longest input (max_seq_length words).
        (EchoModel(), WarmupPlan(data="zero"), [[""], [""] * 4]),
        (EchoModel(), WarmupPlan(batch_sizes=(2,), data="zero"), [["", ""]]),
        (TensorModel(), WarmupPlan(data="zero"), [[[0.0] * 3], [[0.0] * 3] * 4]),
        (TensorModel("INT64", (-1, 2, 2)), WarmupPlan((1,), "zero"), [[[[0, 0], [0, 0]]]]),
        (TensorModel("BOOL", (-1,)), WarmupPlan((2,), "zero"), [[False, False]]),
    ],
)
def test_zero_data_follows_the_models_metadata(
    model: Any, plan: WarmupPlan, expected: list[list[Any]]
) -> None:
    assert warmup_inputs_for(model, plan, 4) == expected


def test_random_text_is_as_long_as_the_model_accepts_and_reproducible() -> None:
    plan = WarmupPlan(batch_sizes=(1, 3), data="random")
    batches = warmup_inputs_for(SampledModel(), plan, 4, seed=1)
    assert [len(batch) for batch in batches] == [1, 3]
    texts = [text for batch in batches for text in batch]
    assert all(len(text.split()) == SampledModel.max_seq_length for text in texts)
    assert len(set(texts)) == len(texts)  # random, not one text repeated
    assert warmup_inputs_for(SampledModel(), plan, 4, seed=1) == batches
    assert warmup_inputs_for(SampledModel(), plan, 4, seed=2) != batches
    unknown_length = warmup_inputs_for(EchoModel(), WarmupPlan((1,), "random"), 4)
    assert len(unknown_length[0][0].split()) == DEFAULT_WARMUP_WORDS


def test_random_numbers_fill_the_declared_shape() -> None:
    (batch,) = warmup_inputs_for(TensorModel("FP32", (-1, 2)), WarmupPlan((3,), "random"), 4)
    assert len(batch) == 3
    assert all(len(row) == 2 and all(0 <= value < 1 for value in row) for row in batch)
    assert len({tuple(row) for row in batch}) == 3


def test_file_data_is_cycled_to_each_size(tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("first line\n\nsecond line\n", encoding="utf-8")
    plan = WarmupPlan(batch_sizes=(1, 3), data="file", file=str(texts))
    assert warmup_inputs_for(EchoModel(), plan, 4) == [
        ["first line"],
        ["first line", "second line", "first line"],
    ]
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text("[1, 2, 3]\n[4, 5, 6]\n", encoding="utf-8")
    plan = WarmupPlan(batch_sizes=(2,), data="file", file=str(numbers))
    assert warmup_inputs_for(TensorModel(), plan, 4) == [[[1, 2, 3], [4, 5, 6]]]


def test_zero_data_cannot_invent_a_variable_shape() -> None:
    with pytest.raises(RuntimeError, match="fixed input shape"):
        warmup_inputs_for(TensorModel("FP32", (-1, -1)), WarmupPlan(data="zero"), 4)


def test_a_failing_warmup_sample_names_its_batch_and_size() -> None:
    class Refuses(SampledModel):
        def predict(self, inputs: list[Any]) -> Sequence[Any]:
            if len(inputs) > 1:
                raise ValueError("too many at once")
            return super().predict(inputs)

    with pytest.raises(RuntimeError) as caught:
        load_and_warm(Refuses(), "cpu", 4)
    message = str(caught.value)
    assert "warm-up batch 2 of 2 (size 4, model data) failed" in message
    assert "too many at once" in message


def test_a_warmup_batch_with_the_wrong_output_count_fails_the_load() -> None:
    class Short(SampledModel):
        def predict(self, inputs: list[Any]) -> Sequence[Any]:
            return list(super().predict(inputs))[:1]

    with pytest.raises(RuntimeError, match=r"batch 2 of 2 \(size 3, model data\) returned 1"):
        load_and_warm(Short(), "cpu", 3)


def test_the_instance_index_reaches_a_load_that_declares_it() -> None:
    declared = SampledModel()
    load_and_warm(declared, "cuda:1", 2, index=3)
    assert (declared.device, declared.index) == ("cuda:1", 3)

    class Options(EchoModel):
        def load(self, device: str, **options: Any) -> None:
            assert options == {}  # **kwargs alone does not opt in
            super().load(device)

    for model in (EchoModel(), Options()):
        load_and_warm(model, "cpu", 2, index=3)
        assert model.device == "cpu"


async def test_the_config_picks_the_instance_kind_and_hands_over_index_and_warmup() -> None:
    model = SampledModel()
    thread = ModelConfig(name="t", warmup_data="zero", warmup_batch_sizes=(2,))
    made = instance_factory_for(thread, 1)(lambda: model, "cpu", "t-1")
    assert isinstance(made, ThreadInstance)
    try:
        info = await made.start(4)
    finally:
        made.close()
    # The configured plan ran (one batch of 2 zero-data texts, not the model's own samples),
    # and the model was told the instance's index.
    assert (made.index, model.index) == (1, 1)
    assert model.batches == [["", ""]] and info.warmup_batches == 1

    def factory() -> EchoModel:
        return EchoModel()

    process = ModelConfig(name="p", instance_kind="process")
    made_process = instance_factory_for(process, 2)(factory, "cpu", "p-2")
    assert isinstance(made_process, ProcessInstance) and made_process.index == 2
    made_process.close()


# ------------------------------------------------------- through the app, thread instances


async def _ready_instances(client: httpx.AsyncClient, model: str, count: int) -> None:
    wanted = f'batching_instances_ready{{model="{model}"}} {count:.1f}'
    for _ in range(3000):
        if wanted in (await client.get("/metrics")).text:
            return
        await asyncio.sleep(0.005)  # polling a probe, as any orchestrator does
    raise AssertionError(f"{model} never had {count} instances ready")


class BarrierModel(EchoModel):
    """Answers only once every instance sharing ``barrier`` is inside ``predict``."""

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__()
        self.barrier = barrier
        self.index = -1

    def load(self, device: str, instance_index: int = 0) -> None:
        super().load(device)
        self.index = instance_index

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        # Raises BrokenBarrierError unless the other instance arrives within the bound.
        self.barrier.wait()
        return [{"index": self.index, "device": self.device} for _ in inputs]


async def test_two_thread_instances_run_two_batches_at_the_same_time() -> None:
    barrier = threading.Barrier(2, timeout=10)
    config = ModelConfig(
        name="pair", devices=("cuda:0", "cuda:1"), batching=BatchingConfig(max_batch_size=1)
    )
    app = create_app(config, builder=lambda _: BarrierModel(barrier))
    async with serving(app) as client:
        await _ready_instances(client, "pair", 2)
        first, second = await asyncio.gather(
            client.post("/", content=b"one"), client.post("/", content=b"two")
        )
    assert first.status_code == second.status_code == 200
    answered = {tuple(r.json()["outputs"][0].values()) for r in (first, second)}
    # Each instance was told its own index and device.
    assert answered == {(0, "cuda:0"), (1, "cuda:1")}


class WarmupGatedModel(EchoModel):
    """Its warm-up batch blocks until the test opens :attr:`gate`; it fails on "bad"."""

    def __init__(self, sample: str = "warm") -> None:
        super().__init__()
        self.sample = sample
        self.gate = threading.Event()
        self.entered = threading.Event()

    def warmup_inputs(self, max_batch_size: int) -> list[list[str]]:
        return [[self.sample] * size for size in sorted({1, max_batch_size})]

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        if "bad" in inputs:
            raise ValueError("cannot warm up on 'bad'")
        if inputs[0] == "warm":
            self.entered.set()
            if not self.gate.wait(timeout=30):
                raise TimeoutError("gate never opened")
        return super().predict(inputs)


async def test_the_model_is_not_ready_until_its_warmup_ran() -> None:
    model = WarmupGatedModel()
    app = create_app(ModelConfig(name="warm"), builder=lambda _: model)
    async with serving(app, wait_ready=False) as client:
        await asyncio.to_thread(model.entered.wait, 10)
        assert (await client.get("/v2/health/ready")).status_code == 503
        assert (await client.post("/", content=b"early")).status_code == 503
        model.gate.set()
        await wait_until_ready(client)
        assert (await client.post("/", content=b"now")).status_code == 200
    assert model.batches[:2] == [["warm"], ["warm"] * 32]


async def test_a_failing_warmup_sample_fails_the_load_with_a_clear_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = WarmupGatedModel("bad")
    config = ModelConfig(name="cold", batching=BatchingConfig(max_batch_size=4))
    app = create_app(config, builder=lambda _: model)
    with caplog.at_level(logging.ERROR, logger="batching"):
        async with serving(app, wait_ready=False) as client:
            for _ in range(2000):
                if any("failed to load" in record.message for record in caplog.records):
                    break
                await asyncio.sleep(0.005)  # polling the log, the only probe of a failure
            else:
                raise AssertionError("the load failure was never logged")
            assert (await client.get("/v2/health/ready")).status_code == 503
    (line,) = [record.message for record in caplog.records if "failed to load" in record.message]
    assert "model cold instance 0 failed to load" in line
    assert "warm-up batch 1 of 2 (size 1, model data) failed" in line
    assert "cannot warm up on 'bad'" in line


class UnloadingModel(WarmupGatedModel):
    """A gated echo that records, with the thread it ran on, each batch and its unload."""

    def __init__(self, sample: str = "sample") -> None:
        super().__init__(sample)
        self.gate.set()
        self.loading = threading.Event()
        self.load_gate = threading.Event()
        self.load_gate.set()
        self.unloaded = threading.Event()
        self.seen: list[tuple[str, str]] = []

    def load(self, device: str) -> None:
        self.loading.set()
        if not self.load_gate.wait(timeout=30):
            raise TimeoutError("never allowed to load")
        super().load(device)

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        outputs = super().predict(inputs)
        self.seen.append(("batch", threading.current_thread().name))
        return outputs

    def unload(self) -> None:
        self.seen.append(("unload", threading.current_thread().name))
        self.unloaded.set()


async def test_closing_an_instance_unloads_its_model_on_its_thread_after_the_last_batch() -> None:
    model = UnloadingModel("warm")
    instance = ThreadInstance(lambda: model, "cpu", "m-0", warmup=WarmupPlan(batch_sizes=(1,)))
    await instance.start(4)
    model.gate.clear()
    model.entered.clear()
    batch = asyncio.ensure_future(instance.run(["warm"]))  # held at the gate
    await asyncio.to_thread(model.entered.wait, 10)
    instance.close()
    assert not model.unloaded.is_set()  # not under the batch still running
    model.gate.set()
    await batch
    assert await asyncio.to_thread(model.unloaded.wait, 10)
    assert model.seen[-2:] == [("batch", "m-0"), ("unload", "m-0")]
    assert [what for what, _ in model.seen].count("unload") == 1
    with pytest.raises(InstanceLost):
        await instance.run(["late"])


async def test_an_instance_closed_while_it_loads_unloads_the_model_once_it_loaded() -> None:
    model = UnloadingModel()
    model.load_gate.clear()
    instance = ThreadInstance(lambda: model, "cpu", "m-0")
    start = asyncio.ensure_future(instance.start(4))
    await asyncio.to_thread(model.loading.wait, 10)
    instance.close()
    model.load_gate.set()
    await start
    assert await asyncio.to_thread(model.unloaded.wait, 10)
    assert model.seen[-1] == ("unload", "m-0")
    with pytest.raises(InstanceLost):
        await instance.run(["late"])


async def test_a_load_that_fails_unloads_what_it_started() -> None:
    model = UnloadingModel("bad")  # its warm-up fails, after load() ran
    instance = ThreadInstance(lambda: model, "cpu", "m-0")
    with pytest.raises(RuntimeError, match="cannot warm up on 'bad'"):
        await instance.start(4)
    assert model.unloaded.is_set() and model.seen == [("unload", "m-0")]
    instance.close()
    assert [what for what, _ in model.seen].count("unload") == 1


async def test_a_server_that_stops_unloads_every_model_it_served() -> None:
    built: list[UnloadingModel] = []

    def build(_: ModelConfig) -> UnloadingModel:
        built.append(UnloadingModel())
        return built[-1]

    config = ModelConfig(name="pair", devices=("cpu", "cpu"))
    async with serving(create_app(config, builder=build)) as client:
        await _ready_instances(client, "pair", 2)
        assert (await client.post("/", content=b"one")).status_code == 200
        loaded = [model for model in built if model.device]
        assert len(loaded) == 2 and not any(model.unloaded.is_set() for model in built)
    for model in loaded:
        assert await asyncio.to_thread(model.unloaded.wait, 10)


# --------------------------------------------------------------------- process instances


def process_config(
    name: str = "proc", devices: tuple[str, ...] = ("cpu",), **batching: Any
) -> ModelConfig:
    return ModelConfig(
        name=name,
        source=PID_MODEL,
        devices=devices,
        instance_kind="process",
        batching=BatchingConfig(**batching),
    )


async def _answer(client: httpx.AsyncClient, text: str) -> dict[str, Any]:
    response = await client.post("/", content=text.encode())
    assert response.status_code == 200, response.text
    return dict(response.json()["outputs"][0])


@pytest.mark.slow
async def test_a_process_instance_serves_through_the_app_and_survives_model_errors() -> None:
    app = create_app(process_config(max_batch_size=64, max_queue_delay=0.05))
    async with serving(app) as client:
        answer = await _answer(client, "hello")
        assert answer["input"] == "hello"
        assert answer["pid"] != os.getpid()
        assert (answer["device"], answer["index"]) == ("cpu", 0)
        # The child's metadata reached the server: it checks text inputs itself.
        assert (await client.post("/", json={"inputs": [1]})).status_code == 422
        texts = [f"good{i}" for i in range(5)] + ["fail"] + [f"fine{i}" for i in range(5)]
        responses = await asyncio.gather(*(client.post("/", content=t.encode()) for t in texts))
        unpicklable = await client.post("/", content=b"unpicklable")
        after = await _answer(client, "after")
    for text, response in zip(texts, responses, strict=True):
        assert response.status_code == (500 if text == "fail" else 200), text
        if text != "fail":
            assert response.json()["outputs"][0]["input"] == text
    assert unpicklable.status_code == 500
    # Model errors are the model's, not the instance's: the same process serves on.
    assert after["pid"] == answer["pid"]


async def _wait_for_file(folder: Path, pattern: str, count: int = 1) -> list[Path]:
    for _ in range(4000):
        found = await asyncio.to_thread(lambda: sorted(folder.glob(pattern)))
        if len(found) >= count:
            return found
        await asyncio.sleep(0.005)  # polling the child's marker file
    raise AssertionError(f"no {pattern} appeared in {folder}")


@pytest.mark.slow
async def test_killing_the_child_fails_its_batch_fast_and_the_instance_restarts(
    tmp_path: Path,
) -> None:
    app = create_app(process_config())
    async with serving(app) as client:
        before = await _answer(client, "before")
        held = asyncio.ensure_future(client.post("/", content=f"hold:{tmp_path}".encode()))
        await _wait_for_file(tmp_path, "entered-*")
        assert before["pid"] != os.getpid()  # a thread instance would answer with ours
        os.kill(before["pid"], signal.SIGKILL)
        in_flight = await asyncio.wait_for(held, timeout=10)
        assert in_flight.status_code == 503
        assert "retry" in in_flight.json()["error"]
        assert (await client.post("/", content=b"while restarting")).status_code == 503
        await wait_until_ready(client)
        after = await _answer(client, "after")
    assert after["pid"] not in (before["pid"], os.getpid())


@pytest.mark.slow
async def test_a_child_killed_while_idle_fails_the_next_request_and_restarts() -> None:
    app = create_app(process_config())
    async with serving(app) as client:
        before = await _answer(client, "before")
        assert before["pid"] != os.getpid()  # a thread instance would answer with ours
        os.kill(before["pid"], signal.SIGKILL)
        next_request = await asyncio.wait_for(client.post("/", content=b"next"), timeout=10)
        assert next_request.status_code == 503
        await wait_until_ready(client)
        after = await _answer(client, "after")
    assert after["pid"] != before["pid"]


@pytest.mark.slow
async def test_two_process_instances_run_two_batches_at_the_same_time(tmp_path: Path) -> None:
    app = create_app(process_config("pair", ("cpu", "cpu"), max_batch_size=1))
    async with serving(app) as client:
        await _ready_instances(client, "pair", 2)
        both = await asyncio.gather(*(_answer(client, f"meet:{tmp_path}") for _ in range(2)))
    # Each child saw the other's marker while it was itself inside predict.
    assert [answer["met"] for answer in both] == [True, True]
    markers = await _wait_for_file(tmp_path, "met-*", 2)
    assert {answer["pid"] for answer in both} == {
        int(path.name.removeprefix("met-")) for path in markers
    }
    assert sorted(answer["index"] for answer in both) == [0, 1]


@pytest.mark.slow
async def test_a_process_instance_reports_death_and_warmup_failures_and_closes(
    tmp_path: Path,
) -> None:
    instance = ProcessInstance(PidModel, "cuda:1", "p-0", index=1)
    info = await instance.start(4)
    assert info.metadata["inputs"][0]["datatype"] == "BYTES"
    pid = instance.pid
    assert pid is not None and pid != os.getpid()
    called = time.perf_counter()
    outputs, seconds = await instance.run(["a", "b"])
    round_trip = time.perf_counter() - called
    assert [(o["input"], o["device"], o["index"], o["pid"]) for o in outputs] == [
        ("a", "cuda:1", 1, pid),
        ("b", "cuda:1", 1, pid),
    ]
    # The child times predict alone: positive, and within the parent's whole round trip.
    assert 0 < seconds < round_trip
    with pytest.raises(ValueError, match="refuses"):
        await instance.run(["fail"])
    with pytest.raises(InstanceLost, match="SystemExit"):
        await instance.run(["exit"])
    instance.close()
    # The child is killed (if its SystemExit had not ended it already) and reaped.
    for _ in range(2000):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.005)  # polling the child's process id: the only probe
    else:
        raise AssertionError(f"the instance process {pid} was still there after close()")
    with pytest.raises(InstanceLost, match="closed"):
        await instance.run(["closed"])

    warmup = tmp_path / "warmup.txt"
    warmup.write_text("ok\nfail\n", encoding="utf-8")
    plan = WarmupPlan(batch_sizes=(1, 2), data="file", file=str(warmup))
    failing = ProcessInstance(PidModel, "cpu", "p-1", warmup=plan)
    try:
        with pytest.raises(RuntimeError, match=r"warm-up batch 2 of 2 \(size 2, file data\)"):
            await failing.start(4)
    finally:
        failing.close()


async def test_a_process_instance_needs_a_picklable_factory() -> None:
    instance = ProcessInstance(lambda: EchoModel(), "cpu", "local-0")
    with pytest.raises(RuntimeError, match="picklable"):
        await instance.start(2)
    assert instance.pid is None  # refused before any process started
    instance.close()


@pytest.mark.slow
def test_the_child_does_not_run_the_parents_main_script(tmp_path: Path) -> None:
    # A script with no __main__ guard: multiprocessing's spawn would run it again in every
    # child, starting a server (here: another instance) each time.
    runs = tmp_path / "runs.txt"
    script = tmp_path / "serve.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio
            from batching.runtime.process import ProcessInstance
            from tests.support.process_models import PidModel

            with open({str(runs)!r}, "a") as log:
                log.write("run\\n")

            async def main():
                instance = ProcessInstance(PidModel, "cpu", "p-0")
                await instance.start(2)
                outputs, _ = await instance.run(["x"])
                instance.close()
                print(outputs[0]["input"])

            asyncio.run(main())
            """
        ),
        encoding="utf-8",
    )
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "x"
    assert runs.read_text().splitlines() == ["run"]


@pytest.mark.slow
async def test_a_gpu_group_without_cuda_fails_the_load_with_a_clear_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    folder = tmp_path / "models" / "minilm"
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text('[[instance_group]]\nkind = "gpu"\n', encoding="utf-8")
    (config,) = load_repository(tmp_path / "models")
    assert config.devices == ("cuda:0",)
    with caplog.at_level(logging.ERROR, logger="batching"):
        async with serving(create_app(config), wait_ready=False) as client:
            for _ in range(4000):
                if any("failed to load" in record.message for record in caplog.records):
                    break
                await asyncio.sleep(0.005)  # polling the log, the only probe of a failure
            else:
                raise AssertionError("the load failure was never logged")
            assert (await client.get("/v2/health/ready")).status_code == 503
    (line,) = [record.message for record in caplog.records if "failed to load" in record.message]
    assert "model minilm instance 0 failed to load" in line
    assert "'cuda:0' asked for, but torch reports no usable CUDA device" in line
