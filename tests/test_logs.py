"""Log lines: one per event, as text or JSON, with the request id where there is one."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import logging.config
import re
import time
from collections.abc import Iterator

import pytest

from batching.logs import JsonFormatter, configure_logging, uvicorn_log_config

#: Every logger these tests (re)configure; each is put back as it was after every test.
TOUCHED = ("batching", "batching.test-json", "uvicorn", "uvicorn.error", "uvicorn.access")

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) (?P<rest>.*)$")


@pytest.fixture(autouse=True)
def restore_loggers() -> Iterator[None]:
    saved = []
    for name in TOUCHED:
        logger = logging.getLogger(name)
        saved.append(
            (logger, logger.level, list(logger.handlers), logger.propagate, logger.disabled)
        )
    try:
        yield
    finally:
        for logger, level, handlers, propagate, disabled in saved:
            logger.setLevel(level)
            logger.handlers[:] = handlers
            logger.propagate = propagate
            logger.disabled = disabled


def json_lines(text: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in text.splitlines()]


def test_json_lines_are_one_object_per_event() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("batching.test-json")
    logger.addHandler(handler)
    logger.propagate = False
    logger.warning("request %s answered %d: %s", "abc-1", 503, "overloaded")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("model failed")
    first, second = json_lines(stream.getvalue())
    assert first["level"] == "warning"
    assert first["message"] == "request abc-1 answered 503: overloaded"
    assert second["message"] == "model failed" and "ValueError: boom" in second["exception"]


def test_configure_logging_json_sends_one_object_per_line_to_stderr_at_its_level(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    configure_logging("debug", "json")
    child = logging.getLogger("batching.deployment")
    child.debug("model %s instance %d ready", "m", 0)
    logging.getLogger("batching").info("serving")
    (debug, info) = json_lines(capsys.readouterr().err)
    assert set(debug) == {"time", "level", "logger", "message"}
    # ISO 8601 with milliseconds and the UTC offset, as Python itself parses it.
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", debug["time"])
    stamped = dt.datetime.fromisoformat(debug["time"])
    assert abs(stamped.timestamp() - time.time()) < 60 and stamped.utcoffset() is not None
    assert (debug["level"], debug["logger"], debug["message"]) == (
        "debug",
        "batching.deployment",
        "model m instance 0 ready",
    )
    assert (info["level"], info["logger"], info["message"]) == ("info", "batching", "serving")
    # Not also propagated to the root logger's handlers: one line per event.
    assert caplog.records == []


def test_configure_logging_text_leaves_out_what_is_below_its_level(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("warning", "text")
    logger = logging.getLogger("batching.batcher")
    logger.info("not shown")
    logger.warning("queue %s is full", "m")
    (line,) = capsys.readouterr().err.splitlines()
    match = TEXT_LINE.match(line)
    assert match is not None, line
    assert (match["level"], match["rest"]) == ("WARNING", "batching.batcher: queue m is full")


def test_configuring_again_replaces_the_handler_instead_of_doubling_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("info", "text")
    configure_logging("info", "json")
    logging.getLogger("batching").info("once")
    (line,) = capsys.readouterr().err.splitlines()
    assert json.loads(line)["message"] == "once"


def _access_line(logger: logging.Logger) -> None:
    # What uvicorn's access logger writes for every request.
    logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "POST", "/", "1.1", 200)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_uvicorn_config_logs_server_lines_in_our_format_and_no_access_lines_at_info(
    log_format: str, capsys: pytest.CaptureFixture[str]
) -> None:
    logging.config.dictConfig(uvicorn_log_config("info", log_format))
    _access_line(logging.getLogger("uvicorn.access"))
    logging.getLogger("uvicorn.error").info("Started server process [%d]", 42)
    (line,) = capsys.readouterr().err.splitlines()
    if log_format == "json":
        document = json.loads(line)
        assert (document["level"], document["logger"], document["message"]) == (
            "info",
            "uvicorn.error",
            "Started server process [42]",
        )
    else:
        match = TEXT_LINE.match(line)
        assert match is not None, line
        assert (match["level"], match["rest"]) == (
            "INFO",
            "uvicorn.error: Started server process [42]",
        )


def test_uvicorn_config_follows_the_level_for_server_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logging.config.dictConfig(uvicorn_log_config("warning", "text"))
    logging.getLogger("uvicorn.error").info("Waiting for application startup.")
    logging.getLogger("uvicorn.error").warning("Invalid HTTP request received.")
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("WARNING uvicorn.error: Invalid HTTP request received.")
