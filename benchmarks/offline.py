"""The model's offline capacity on this machine: items per second of ``predict`` called directly
in this process (tokenise, forward, pool) at one batch size, with no server in the way.

    python benchmarks/offline.py                         # the default model, batch 32, 5 s
    python benchmarks/offline.py --batch 1 --seconds 3 --model ./my-model --task fill-mask

Prints one JSON object: ``{"model", "batch", "items_per_s", "seconds"}``. ``python -m
load_test.overload`` runs it to tell a slow machine from a slow server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from batching.models import ModelSource, hooks_of  # noqa: E402
from benchmarks.serving import offline_rate, sentences  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="as server.py's --model (default: the packaged model)")
    parser.add_argument("--task", help="as server.py's --task")
    parser.add_argument("--batch", type=int, default=32, help="items per predict call")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to measure")
    args = parser.parse_args(argv)
    source = ModelSource.parse(args.model, args.task)
    model = source.build()
    model.load("cpu")
    warmup = hooks_of(model).warmup_inputs
    for batch in warmup(args.batch) if warmup is not None else []:
        model.predict(list(batch))
    started = time.perf_counter()
    rate = offline_rate(model, args.batch, args.seconds, sentences(600))
    print(
        json.dumps(
            {
                "model": source.default_name,
                "batch": args.batch,
                "items_per_s": rate,
                "seconds": time.perf_counter() - started,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
