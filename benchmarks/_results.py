"""How a benchmark ends: its table printed, its figures written as JSON where asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def finish(result: dict[str, Any], table: str, out: Path | None) -> int:
    """Print ``table``; write ``result`` to ``out`` (folders made) when given; exit code 0."""
    print(table)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    return 0
