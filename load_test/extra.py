"""The load-testing tool needs the ``[loadtest]`` extra (httpx, matplotlib, tqdm, psutil), which
``pip install -e .`` alone does not install: say so in one line instead of a traceback.

Only the standard library here: this module runs before anything that needs the extra.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["EXTRA_MODULES", "INSTALL", "missing_modules", "require_loadtest_extra"]

#: The modules the ``loadtest`` extra installs (pyproject.toml), by import name.
EXTRA_MODULES = ("httpx", "matplotlib", "tqdm", "psutil")

#: How to install them, from a clone of the repository.
INSTALL = 'pip install -e ".[loadtest]"'


def missing_modules() -> list[str]:
    """The extra's modules that cannot be imported here."""
    return [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None]


def require_loadtest_extra(command: str) -> None:
    """Exit with status 2 and one line naming what to install when the extra is missing."""
    missing = missing_modules()
    if missing:
        print(
            f"{command}: error: the load-testing tool needs the [loadtest] extra "
            f"({', '.join(missing)} missing): run {INSTALL} in the repository "
            '(or pip install "batching[loadtest]")',
            file=sys.stderr,
        )
        raise SystemExit(2)
