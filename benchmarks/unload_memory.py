"""Resident memory given back by an unload: ``python server.py --model-control-mode explicit``
serves the default model; a second copy of it is loaded at run time, sent a few batches,
unloaded; the server's RSS (psutil) is read before the load, once loaded, and after the unload
(docs/model-control.md: it must come back to within 10 % of the level before the load).

    python benchmarks/unload_memory.py                       # the engine auto chooses
    python benchmarks/unload_memory.py --engine torch --precision fp32 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from load_test.procstat import rss_bytes  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402

TEXTS = ["the cat sat on the mat " * 20] * 16


def repository(engine: str, precision: str, with_copy: bool) -> str:
    settings = f'source = "default"\nengine = "{engine}"\nprecision = "{precision}"\n'
    tables = f"[models.serving]\n{settings}"
    if with_copy:
        tables += f"\n[models.copy]\n{settings}"
    return tables


def mib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**20:.0f} MiB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="auto", help="the models' engine (default: auto)")
    parser.add_argument("--precision", default="auto", help="the models' precision")
    parser.add_argument("--rounds", type=int, default=2, help="load/unload rounds")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="unload-memory-"))
    file = folder / "models.toml"
    file.write_text(repository(args.engine, args.precision, with_copy=False))
    flags = ["--model-repository", str(file), "--model-control-mode", "explicit"]
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}]}
    with (
        ServerProcess(flags, cwd=ROOT, log_path=folder / "server.log") as server,
        httpx.Client(base_url=server.url, timeout=600) as client,
    ):
        pid = server.pid
        assert pid is not None
        for _ in range(3):
            client.post("/v2/models/serving/infer", json=body).raise_for_status()
        file.write_text(repository(args.engine, args.precision, with_copy=True))
        for round_ in range(1, args.rounds + 1):
            before = rss_bytes(pid)
            client.post("/v2/repository/models/copy/load").raise_for_status()
            for _ in range(3):
                client.post("/v2/models/copy/infer", json=body).raise_for_status()
            loaded = rss_bytes(pid)
            client.post("/v2/repository/models/copy/unload").raise_for_status()
            after = rss_bytes(pid)
            change = "?" if not before or after is None else f"{after / before - 1:+.1%}"
            print(
                f"round {round_}: before the load {mib(before)}, loaded {mib(loaded)}, "
                f"after the unload {mib(after)} ({change} of the level before)"
            )


if __name__ == "__main__":
    main()
