"""The server against the best engine's offline limit, in pairs taken back to back.

A serving benchmark harness measures the offline limit (``engines.py VARIANTS ROUNDS OUT``:
each engine in its own process, tokenise, forward, pool, normalise) and a server under load
(``run_matrix.py``, wrk on the same cores). A ratio of one run of each, minutes apart, carries
the host's drift (a 2-core VM's speed moves by a quarter within minutes). So this script runs
them in pairs, one short round each, back to back, ``--pairs`` times, and alternates which
goes first (limit then server, server then limit, ...) so that a steady drift falls on both
sides alike. Each pair gives a ratio per load: the server's items/s against the best
variant's offline items/s at the batch size the load asks of it (batch 1 for one client,
``--batch`` for many); the medians of the pairs' ratios are the figures.

    python benchmarks/limit_pairs.py --harness ../bench --pairs 5 --out docs/results/x.json
    python benchmarks/limit_pairs.py --harness ../bench --server-arg=--torch-threads=2

Run it on a quiet machine: nothing else on the cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._results import finish  # noqa: E402

#: The load each ratio is taken at -> the offline batch size it is held against.
LOADS = {"c1": 1, "c64": 32}


def server_spec(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The harness's server description of this checkout's ``server.py``."""
    command = [sys.executable, str(ROOT / "server.py"), "--host", "127.0.0.1"]
    command += ["--port", "{port}", "--grpc-port", "0", *args.server_arg]
    env = {"BATCHING_ENGINE_CACHE": str(args.engine_cache)} if args.engine_cache else {}
    spec = {"name": "this", "cmd": command, "cwd": str(ROOT), "path": "/"}
    return [{**spec, "body_key": "inputs", "batching": True, "env": env}]


def offline_limit(args: argparse.Namespace, work: Path, index: int) -> dict[int, float]:
    """One round of the harness's ``engines.py``: batch size -> the best variant's items/s on
    short sentences."""
    out = work / f"engines-{index}.json"
    command = [sys.executable, "engines.py", args.variants, "1", str(out), str(work / "engwork")]
    subprocess.run(command, cwd=args.harness, check=True, capture_output=True)
    cells = {name: data["cells"] for name, data in json.loads(out.read_text()).items()}
    limit = {}
    for batch in sorted(set(LOADS.values())):
        key = f"short/{batch}"
        limit[batch] = max(rates[key]["items_s_med"] for rates in cells.values() if key in rates)
    return limit


def served(args: argparse.Namespace, work: Path, spec: Path, index: int) -> dict[str, float]:
    """One round of the harness's ``run_matrix.py`` with this server alone: load -> items/s."""
    out = work / f"matrix-{index}"
    command = [sys.executable, "run_matrix.py", "--spec", str(spec), "--servers", "this"]
    command += ["--on-loads", ",".join(LOADS), "--off-loads", "", "--rounds", "1"]
    command += ["--duration", str(args.duration), "--out", str(out)]
    subprocess.run(command, cwd=args.harness, check=True, capture_output=True)
    rows = [json.loads(line) for line in (out / "matrix_minilm.jsonl").read_text().splitlines()]
    return {row["load"]: float(row["items_s"]) for row in rows if row.get("server") == "this"}


def run(args: argparse.Namespace) -> dict[str, Any]:
    pairs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="limit-pairs-") as folder:
        work = Path(folder)
        spec = work / "spec.json"
        spec.write_text(json.dumps(server_spec(args)))
        for index in range(args.pairs):
            limit_first = index % 2 == 0
            started = time.strftime("%H:%M:%S")
            if limit_first:
                limit = offline_limit(args, work, index)
                rates = served(args, work, spec, index)
            else:
                rates = served(args, work, spec, index)
                limit = offline_limit(args, work, index)
            ratios = {load: rates[load] / limit[batch] for load, batch in LOADS.items()}
            pair = {
                "pair": index + 1,
                "started": started,
                "first": "limit" if limit_first else "server",
                "limit_items_s": {str(batch): round(rate, 1) for batch, rate in limit.items()},
                "server_items_s": {load: round(rate, 1) for load, rate in rates.items()},
                "ratio": {load: round(ratio, 3) for load, ratio in ratios.items()},
            }
            pairs.append(pair)
            print(json.dumps(pair), flush=True)
    medians = {
        load: round(statistics.median(pair["ratio"][load] for pair in pairs), 3) for load in LOADS
    }
    return {
        "command": described(args),
        "variants": args.variants,
        "duration_s": args.duration,
        "server_args": args.server_arg,
        "pairs": pairs,
        "median_ratio": medians,
        "lowest_ratio": {load: min(pair["ratio"][load] for pair in pairs) for load in LOADS},
    }


def described(args: argparse.Namespace) -> str:
    """The command, with the harness named by its folder alone (no path of this machine)."""
    words = ["python benchmarks/limit_pairs.py", f"--harness {args.harness.name}"]
    words += [f"--pairs {args.pairs}", f"--variants {args.variants}"]
    words += [f"--duration {args.duration:g}"]
    words += [f"--server-arg={arg}" for arg in args.server_arg]
    return " ".join(words)


def table(result: dict[str, Any]) -> str:
    lines = [
        "| pair | first | limit, batch 1 / 32 | server, 1 / 64 clients | ratio, 1 / 64 clients |",
        "|---|---|---|---|---|",
    ]
    for pair in result["pairs"]:
        limit, rates, ratio = pair["limit_items_s"], pair["server_items_s"], pair["ratio"]
        lines.append(
            f"| {pair['pair']} | {pair['first']} | {limit['1']:.0f} / {limit['32']:.0f} "
            f"| {rates['c1']:.0f} / {rates['c64']:.0f} "
            f"| {ratio['c1']:.2f} / {ratio['c64']:.2f} |"
        )
    medians = result["median_ratio"]
    lines.append(f"| median | | | | **{medians['c1']:.2f} / {medians['c64']:.2f}** |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--harness", type=Path, required=True, help="the folder of engines.py and run_matrix.py"
    )
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument(
        "--variants",
        default="ort_fp32_trfopt,ov_bf16",
        help="engines.py variants the limit is the best of (default: the best at batch 1 and "
        "at batch 32 on the CPUs measured so far)",
    )
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per load")
    parser.add_argument("--engine-cache", type=Path, default=None)
    parser.add_argument("--server-arg", action="append", default=[], help="passed to server.py")
    parser.add_argument("--out", type=Path, default=None, help="write the pairs here (JSON)")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    args.harness = args.harness.resolve()
    for script in ("engines.py", "run_matrix.py"):
        if not (args.harness / script).is_file():
            parser.error(f"--harness has no {script}")
    result = run(args)
    return finish(result, table(result), args.out)


if __name__ == "__main__":
    sys.exit(main())
