"""The flags' machinery: every flag has a ``BATCHING_*`` environment variable twin
(``--api-key`` and ``BATCHING_API_KEY``); repeatable flags take a comma list in theirs. And
the one way a bad setting stops the start: :func:`fail`, one line and exit status 2."""

from __future__ import annotations

import argparse
import builtins
import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NoReturn

from batching.keys import split_keys

__all__ = [
    "ENV_PREFIX",
    "PROG",
    "BadSetting",
    "Parser",
    "env_name",
    "fail",
    "one_line",
    "repeated",
    "switch",
]

ENV_PREFIX = "BATCHING_"
#: The program the messages name.
PROG = "server.py"


class BadSetting(SystemExit):
    """A start-up setting that cannot be served: exit status 2, and the one line printed."""

    def __init__(self, line: str) -> None:
        super().__init__(2)
        self.line = line

    def __str__(self) -> str:
        return self.line


def fail(message: str) -> NoReturn:
    """Stop the start: ``server.py: error: <message>`` on stderr, one line (no usage text to
    bury it), and exit status 2.

    :raises BadSetting: always (a :class:`SystemExit`).
    """
    line = f"{PROG}: error: {message}"
    print(line, file=sys.stderr)
    raise BadSetting(line)


@contextlib.contextmanager
def one_line(prefix: str = "") -> Iterator[None]:
    """Within the block, a ``ValueError`` (every settings error is one: it says what to fix)
    stops the start through :func:`fail`, its message after ``prefix``."""
    try:
        yield
    except ValueError as exc:
        fail(f"{prefix}{exc}")


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


class Parser(argparse.ArgumentParser):
    """argparse with flags whose defaults come from their ``BATCHING_*`` variables."""

    def __init__(self, environ: Mapping[str, str], *, description: str) -> None:
        super().__init__(prog=PROG, description=description)
        self.environ = environ

    def error(self, message: str) -> NoReturn:
        """argparse's own refusals (an unknown flag, a value of the wrong type or not among
        the choices): one line, as every other bad setting."""
        fail(message)

    def flag(
        self,
        flag: str,
        *,
        help: str,
        default: str | int | float | None = None,
        type: Callable[[str], object] | None = None,
        choices: Sequence[str] | None = None,
    ) -> None:
        """A flag and its variable twin (which sets the default); its values are of its
        default's type (``type`` says which for a flag with no default: str unless given)."""
        env = env_name(flag)
        value = self.environ.get(env, default)
        shown = "" if default is None else f" (default: {default})"
        self.add_argument(
            flag,
            default=value,
            type=type or (str if default is None else builtins.type(default)),
            choices=choices,
            help=f"{help}{shown} [env {env}]",
        )

    def flags(self, rows: Sequence[tuple[str, str | int | float, str]]) -> None:
        """Flags of a table, in order: each its name, its default and its help (as
        :meth:`flag` takes them)."""
        for flag, default, help in rows:
            self.flag(flag, default=default, help=help)

    def switch_flag(self, flag: str, *, help: str) -> None:
        """An on/off flag; its variable twin says 1 or 0 (:func:`switch`)."""
        self.add_argument(
            flag,
            action="store_true",
            default=switch(self.environ, flag),
            help=f"{help} [env {env_name(flag)}=1]",
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
    fail(f"{env} must be 1 or 0 (true or false), not {value!r}")
