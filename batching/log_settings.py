"""The log level at run time: Triton's logging extension (``GET/POST /v2/logging``, the gRPC
``LogSettings``), so an operator can turn DEBUG on for a minute without a restart.

Triton's settings map onto the level of the ``batching`` logger, where every line of the
server is written: ``log_verbose_level`` > 0 is DEBUG, else ``log_info`` INFO, else
``log_warning`` WARNING, else ``log_error`` ERROR, and all three off leaves CRITICAL only.
``log_level`` (``debug``, ``info``, ``warning``, ``error``, ``critical``) sets the level by
name and wins over the others. ``log_file`` is always "": the server logs to its standard
error and never opens a file a request names. ``log_format`` is what the server was started
with (``--log-format``), and cannot be changed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from batching.errors import InvalidRequest

__all__ = ["LEVELS", "LogSettings"]

logger = logging.getLogger("batching")

#: ``log_level`` names and their levels.
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

_FLAGS = ("log_info", "log_warning", "log_error")


class LogSettings:
    """Reads and changes the level of ``target`` (the ``batching`` logger by default).

    :param log_format: the format the server logs in, as ``--log-format`` named it.
    """

    def __init__(self, log_format: str = "text", target: logging.Logger | None = None) -> None:
        self.log_format = log_format
        self.target = target if target is not None else logger

    def current(self) -> dict[str, object]:
        """Triton's settings for the level now, and ``log_level``."""
        level = self.target.getEffectiveLevel()
        return {
            "log_file": "",
            "log_info": level <= logging.INFO,
            "log_warning": level <= logging.WARNING,
            "log_error": level <= logging.ERROR,
            "log_verbose_level": 1 if level <= logging.DEBUG else 0,
            "log_format": self.log_format,
            "log_level": logging.getLevelName(level).lower(),
        }

    def update(self, settings: Mapping[str, object]) -> dict[str, object]:
        """Apply ``settings`` (any of Triton's keys, or ``log_level``) and return the
        settings now. Nothing changes when one key is refused.

        :raises InvalidRequest: an unknown key, a wrong type, a log file, another format.
        """
        now = self.current()
        flags = {key: bool(now[key]) for key in _FLAGS}
        verbose = 1 if now["log_verbose_level"] else 0
        named: int | None = None
        for key, value in settings.items():
            if key in _FLAGS:
                if not isinstance(value, bool):
                    raise InvalidRequest(f"{key}: must be true or false, got {value!r}")
                flags[key] = value
            elif key == "log_verbose_level":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise InvalidRequest(f"log_verbose_level: must be an integer >= 0: {value!r}")
                verbose = value
            elif key == "log_level":
                if not isinstance(value, str) or value.lower() not in LEVELS:
                    raise InvalidRequest(
                        f"log_level: must be one of {', '.join(LEVELS)}, got {value!r}"
                    )
                named = LEVELS[value.lower()]
            elif key == "log_file":
                if value not in ("", None):
                    raise InvalidRequest(
                        "log_file: this server logs to its standard error; it never opens a "
                        "file a request names"
                    )
            elif key == "log_format":
                if value not in (self.log_format, "default"):
                    raise InvalidRequest(
                        f"log_format: the server logs as {self.log_format} (--log-format, "
                        f"set at start), got {value!r}"
                    )
            else:
                raise InvalidRequest(
                    f"{key}: not a log setting (log_level, log_verbose_level, log_info, "
                    "log_warning, log_error, log_file, log_format)"
                )
        if named is not None:
            level = named
        elif verbose > 0:
            level = logging.DEBUG
        elif flags["log_info"]:
            level = logging.INFO
        elif flags["log_warning"]:
            level = logging.WARNING
        elif flags["log_error"]:
            level = logging.ERROR
        else:
            level = logging.CRITICAL
        before = self.target.getEffectiveLevel()
        self.target.setLevel(level)
        if level != before:
            # At the higher of both levels, so the change shows in the log it affects.
            self.target.log(
                max(level, before, logging.WARNING),
                "log level changed from %s to %s",
                logging.getLevelName(before),
                logging.getLevelName(level),
            )
        return self.current()
