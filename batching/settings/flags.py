"""The flags' machinery: every flag has a ``BATCHING_*`` environment variable twin
(``--api-key`` and ``BATCHING_API_KEY``); repeatable flags take a comma list in theirs."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence

from batching.keys import split_keys

__all__ = ["ENV_PREFIX", "Parser", "env_name", "repeated", "switch"]

ENV_PREFIX = "BATCHING_"


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


class Parser(argparse.ArgumentParser):
    """argparse with flags whose defaults come from their ``BATCHING_*`` variables."""

    def __init__(self, environ: Mapping[str, str], *, prog: str, description: str) -> None:
        super().__init__(prog=prog, description=description)
        self.environ = environ

    def flag(
        self,
        flag: str,
        *,
        help: str,
        default: object = None,
        type: Callable[[str], object] = str,
        choices: Sequence[str] | None = None,
    ) -> None:
        env = env_name(flag)
        value = self.environ.get(env, default)
        shown = "" if default is None else f" (default: {default})"
        self.add_argument(
            flag,
            default=value,
            type=type,
            choices=choices,
            help=f"{help}{shown} [env {env}]",
        )

    def repeated_flag(self, flag: str, *, help: str) -> None:
        """A flag that may be given several times; its variable twin holds a comma list, used
        only when the flag is not given."""
        env = env_name(flag)
        self.add_argument(
            flag,
            action="append",
            default=None,
            help=f"{help} (repeatable) [env {env}, comma-separated]",
        )


def repeated(given: list[str] | None, flag: str, environ: Mapping[str, str]) -> list[str]:
    """The values of a repeatable flag: the flags given, else its variable's comma list."""
    if given is not None:
        return [value for text in given for value in split_keys(text)]
    return split_keys(environ.get(env_name(flag), ""))


def switch(environ: Mapping[str, str], flag: str) -> bool:
    """An on/off flag's environment twin: 1/true/yes/on is on, 0/false/no/off/unset is off.

    :raises SystemExit: any other value, naming the variable.
    """
    env = env_name(flag)
    value = environ.get(env, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise SystemExit(f"server.py: error: {env} must be 1 or 0 (true or false), not {value!r}")
