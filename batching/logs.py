"""Logging set-up: one line per event, as text or as JSON."""

from __future__ import annotations

import datetime as dt
import logging
import sys

import orjson

__all__ = ["JsonFormatter", "configure_logging", "iso_time", "uvicorn_log_config"]

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def iso_time(created: float) -> str:
    """``created`` (seconds since the epoch) as ISO 8601 local time with milliseconds and the
    UTC offset: ``2026-11-23T17:55:35.123+00:00``. Events a few ms apart stay in order."""
    return dt.datetime.fromtimestamp(created).astimezone().isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, object] = {
            "time": iso_time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(document).decode()


def _formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT_FORMAT)


def configure_logging(level: str = "info", log_format: str = "text") -> None:
    """Send the ``batching`` logger's lines to stderr in ``log_format``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(log_format))
    logger = logging.getLogger("batching")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


def uvicorn_log_config(level: str, log_format: str) -> dict[str, object]:
    """uvicorn's own loggers in the same format; access logs off (nothing per request at
    INFO)."""
    formatter: dict[str, object] = (
        {"()": JsonFormatter} if log_format == "json" else {"format": _TEXT_FORMAT}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "formatter": "default",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
        },
    }
