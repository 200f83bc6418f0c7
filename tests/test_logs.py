"""Log lines: one per event, as text or JSON, with the request id where there is one."""

from __future__ import annotations

import io
import json
import logging

from batching.logs import JsonFormatter, configure_logging, uvicorn_log_config


def test_json_lines_are_one_object_per_event() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("batching.test-json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("request %s answered %d: %s", "abc-1", 503, "overloaded")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("model failed")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["level"] == "warning"
    assert first["message"] == "request abc-1 answered 503: overloaded"
    assert second["message"] == "model failed" and "ValueError: boom" in second["exception"]


def test_configure_logging_and_no_access_log_at_info() -> None:
    configure_logging("debug", "json")
    logger = logging.getLogger("batching")
    assert logger.level == logging.DEBUG
    assert isinstance(logger.handlers[0].formatter, JsonFormatter)
    config = uvicorn_log_config("info", "text")
    assert config["loggers"]["uvicorn.access"]["level"] == "WARNING"
    configure_logging("info", "text")
