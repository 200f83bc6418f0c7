"""A test model that records which process ran each batch, to tell replicas apart."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.models import EchoModel


class RecordingModel(EchoModel):
    """Echo (the same answers in every process) that appends each batch's size to
    ``$RECORD_DIR/<pid>`` when ``RECORD_DIR`` is set."""

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        folder = os.environ.get("RECORD_DIR")
        if folder:
            with open(Path(folder) / str(os.getpid()), "a", encoding="utf-8") as record:
                record.write(f"{len(inputs)}\n")
        return super().predict(inputs)
