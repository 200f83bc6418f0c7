"""The log of error answers: client mistakes at DEBUG, server failures at WARNING each, and
shedding (503, 504) summarised, so that an overload does not log thousands of lines a second."""

from __future__ import annotations

import logging

import pytest

from batching import ModelConfig, answers, create_app
from batching.answers import SUMMARY_INTERVAL, AnswerLog
from tests.support.asgi import serving
from tests.support.models import SlowLoadModel


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> tuple[AnswerLog, Clock, pytest.LogCaptureFixture]:
    logger = logging.getLogger("batching.test-answers")
    caplog.set_level(logging.DEBUG, logger=logger.name)
    clock = Clock()
    return AnswerLog(logger, clock), clock, caplog


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == level]


def test_client_mistakes_are_debug_and_server_failures_warn_every_time(
    log: tuple[AnswerLog, Clock, pytest.LogCaptureFixture],
) -> None:
    recorder, _, caplog = log
    recorder.answered("request a", 400, "not JSON")
    for index in range(3):
        recorder.answered(f"request f{index}", 500, "the model failed")
    assert lines(caplog, logging.DEBUG) == ["request a answered 400: not JSON"]
    assert lines(caplog, logging.WARNING) == [
        f"request f{index} answered 500: the model failed" for index in range(3)
    ]


def test_shedding_warns_once_then_summarises_each_interval(
    log: tuple[AnswerLog, Clock, pytest.LogCaptureFixture],
) -> None:
    recorder, clock, caplog = log
    recorder.answered("request 1", 503, "overloaded")
    for index in range(2, 1002):
        clock.now += 0.001
        recorder.answered(f"request {index}", 503, "overloaded")
    assert lines(caplog, logging.WARNING) == ["request 1 answered 503: overloaded"]
    # Every one can still be followed at DEBUG.
    assert len(lines(caplog, logging.DEBUG)) == 1000
    clock.now += SUMMARY_INTERVAL
    recorder.answered("request 1002", 503, "overloaded")
    assert lines(caplog, logging.WARNING)[1] == (
        "request 1002 answered 503: overloaded "
        "(and 1000 more answered 503 in the last 10 s; each at DEBUG)"
    )
    # A quiet interval, then one more: said plainly, with no count.
    clock.now += 2 * SUMMARY_INTERVAL
    recorder.answered("request 1003", 503, "overloaded")
    assert lines(caplog, logging.WARNING)[2] == "request 1003 answered 503: overloaded"


def test_each_shedding_status_has_its_own_interval(
    log: tuple[AnswerLog, Clock, pytest.LogCaptureFixture],
) -> None:
    recorder, clock, caplog = log
    recorder.answered("request 1", 503, "overloaded")
    clock.now += 1
    recorder.answered("request 2", 504, "its deadline passed")
    recorder.answered("request 3", 504, "its deadline passed")
    assert lines(caplog, logging.WARNING) == [
        "request 1 answered 503: overloaded",
        "request 2 answered 504: its deadline passed",
    ]


@pytest.mark.anyio
async def test_the_doors_say_a_burst_of_refusals_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model that is not ready refuses every request (503) through every door: the log
    warns of the first and keeps the rest at DEBUG, where each can still be followed."""
    monkeypatch.setattr(answers.answer_log, "_windows", {})  # no earlier test's interval
    loading = SlowLoadModel()
    app = create_app(ModelConfig(name="loading"), builder=lambda config: loading)
    caplog.set_level(logging.DEBUG, logger="batching")
    try:
        async with serving(app, wait_ready=False) as client:
            for index in range(20):
                plain = await client.post("/models/loading", content=b"a")
                v2 = await client.post(
                    "/v2/models/loading/infer",
                    json={
                        "inputs": [
                            {
                                "name": "text",
                                "datatype": "BYTES",
                                "shape": [1],
                                "data": [str(index)],
                            }
                        ]
                    },
                )
                assert (plain.status_code, v2.status_code) == (503, 503)
    finally:
        loading.loaded.set()
    refusals = [r for r in caplog.records if "answered 503" in r.getMessage()]
    assert len(refusals) == 40
    assert [r.levelno for r in refusals].count(logging.WARNING) == 1
    assert refusals[0].levelno == logging.WARNING
