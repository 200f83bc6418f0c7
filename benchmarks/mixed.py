"""Two models of one server under load at once: does one starve the other?

One server serves a repository of two models: ``embedder`` (the packaged all-MiniLM-L6-v2,
engine ``auto``) and ``gpt`` (benchmarks/generation.py's small GPT-2). Two loads, each from
a client process of its own:

- **generation**: ``--streams`` concurrent OpenAI ``/v1/completions`` streams, closed loop,
  greedy, ``max_tokens`` mixed between 8 and 128: output tokens/s (tokens of the requests
  that finished within the window);
- **embedding**: ``--clients`` concurrent clients, closed loop, one short sentence per
  ``POST /v1/embeddings``: items/s and latency p50/p99.

Each round runs three phases, in an order that rotates from round to round so that a drift
of the machine falls on every phase: generation alone, embedding alone, both together. It
prints each round's ratios (together / alone) and their medians:

- generation kept: tokens/s together / tokens/s alone (target >= 0.4)
- embedding kept: items/s together / items/s alone (target >= 0.4)
- embedding p99 together / alone (target <= 3)

    python benchmarks/mixed.py --rounds 3 --seconds 15 --out docs/results/mixed.json
    python benchmarks/mixed.py --quick         # checks that it runs (tiny model, 2 s)

Run it on a quiet machine: the two cores are what the models share, and anything else
running takes from both phases unevenly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import httpx  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._results import finish  # noqa: E402
from benchmarks.generation import build_model, workload  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402

SENTENCES = [
    "the cat sat on the mat",
    "a quick brown fox jumps over the lazy dog",
    "servers batch requests to use the cores well",
    "green fish swim in the river under blue skies",
]
PHASES = ("generation", "embedding", "together")


def repository(root: Path, quick: bool) -> Path:
    """The two models' repository (a folder per model, as an operator writes it)."""
    width, layers = (32, 2) if quick else (256, 4)
    gpt = build_model(root / "gpt-files", 512, width, layers)
    models = root / "models"
    (models / "embedder").mkdir(parents=True)
    (models / "embedder" / "config.toml").write_text('source = "default"\n')
    (models / "gpt").mkdir(parents=True)
    (models / "gpt" / "config.toml").write_text(
        f'source = "{gpt.as_posix()}"\ntask = "text-generation"\nmax_batch_size = 16\n'
    )
    return models


async def _generate(url: str, streams: int, seconds: float) -> dict[str, Any]:
    reqs = workload(256, 8, 128)
    deadline = time.perf_counter() + seconds
    tokens = 0
    finished = 0

    async def worker(client: httpx.AsyncClient, index: int) -> None:
        nonlocal tokens, finished
        position = index
        while time.perf_counter() < deadline:
            req = reqs[position % len(reqs)]
            position += streams
            body = {
                "model": "gpt",
                "prompt": req.prompt,
                "max_tokens": req.max_new,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            used = 0
            async with client.stream("POST", f"{url}/v1/completions", json=body) as answer:
                answer.raise_for_status()
                async for line in answer.aiter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            raise RuntimeError(chunk["error"]["message"])
                        if chunk.get("usage"):
                            used = chunk["usage"]["completion_tokens"]
            if time.perf_counter() <= deadline:
                tokens += used
                finished += 1

    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client, i) for i in range(streams)))
        del started
    return {"tokens_per_s": tokens / seconds, "requests": finished}


async def _embed(url: str, clients: int, seconds: float) -> dict[str, Any]:
    deadline = time.perf_counter() + seconds
    latencies: list[float] = []
    failed = 0

    async def worker(client: httpx.AsyncClient, index: int) -> None:
        nonlocal failed
        position = index
        while time.perf_counter() < deadline:
            body = {"model": "embedder", "input": SENTENCES[position % len(SENTENCES)]}
            position += 1
            sent = time.perf_counter()
            answer = await client.post(f"{url}/v1/embeddings", json=body)
            if answer.status_code != 200:
                failed += 1
                continue
            if time.perf_counter() <= deadline:
                latencies.append(time.perf_counter() - sent)

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(worker(client, i) for i in range(clients)))
    latencies.sort()
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    return {
        "items_per_s": len(latencies) / seconds,
        "p50_ms": p(0.50) if latencies else None,
        "p99_ms": p(0.99) if latencies else None,
        "failed": failed,
    }


def client_main(kind: str, url: str, amount: int, seconds: float) -> None:
    """One load, in this process: its figures as one JSON line on stdout."""
    run = _generate if kind == "generation" else _embed
    print(json.dumps(asyncio.run(run(url, amount, seconds))))


def _client(kind: str, url: str, amount: int, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--client", kind, "--url", url]
        + ["--amount", str(amount), "--seconds", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _result(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"a client failed (exit {process.returncode})")
    return dict(json.loads(out.strip().splitlines()[-1]))


def phase(name: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One phase: the loads it runs, side by side; each load's figures."""
    started: dict[str, subprocess.Popen[str]] = {}
    if name in ("generation", "together"):
        started["generation"] = _client("generation", url, args.streams, args.seconds)
    if name in ("embedding", "together"):
        started["embedding"] = _client("embedding", url, args.clients, args.seconds)
    return {kind: _result(process) for kind, process in started.items()}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0, help="each phase's window")
    parser.add_argument("--streams", type=int, default=16, help="concurrent generation streams")
    parser.add_argument("--clients", type=int, default=8, help="concurrent embedding clients")
    parser.add_argument("--server-flag", action="append", default=[], help="passed to server.py")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 2 s: checks it runs")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument("--client", choices=("generation", "embedding"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--amount", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args.client, args.url, args.amount, args.seconds)
        return 0
    if args.quick:
        args.rounds, args.seconds = 1, 2.0
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        models = repository(Path(tmp), args.quick)
        flags = ["--model-repository", str(models), *args.server_flag]
        with ServerProcess(flags, cwd=ROOT, log_path=Path(tmp) / "server.log") as server:
            phase("together", server.url, argparse.Namespace(**{**vars(args), "seconds": 2.0}))
            for number in range(args.rounds):
                order = PHASES[number % 3 :] + PHASES[: number % 3]
                figures = {name: phase(name, server.url, args) for name in order}
                rounds.append({"order": list(order), **figures})
    kept_gen, kept_emb, p99_ratio = [], [], []
    lines = [
        "| round | order | gen tok/s alone / together | emb items/s alone / together "
        "| emb p99 ms alone / together | gen kept | emb kept | p99 ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for number, figures in enumerate(rounds, 1):
        gen_alone = figures["generation"]["generation"]["tokens_per_s"]
        gen_both = figures["together"]["generation"]["tokens_per_s"]
        emb_alone = figures["embedding"]["embedding"]
        emb_both = figures["together"]["embedding"]
        kept_gen.append(gen_both / gen_alone if gen_alone else float("nan"))
        kept_emb.append(emb_both["items_per_s"] / emb_alone["items_per_s"])
        p99_ratio.append(emb_both["p99_ms"] / emb_alone["p99_ms"])
        lines.append(
            f"| {number} | {', '.join(figures['order'])} | {gen_alone:.0f} / {gen_both:.0f} "
            f"| {emb_alone['items_per_s']:.0f} / {emb_both['items_per_s']:.0f} "
            f"| {emb_alone['p99_ms']:.1f} / {emb_both['p99_ms']:.1f} "
            f"| {kept_gen[-1]:.2f} | {kept_emb[-1]:.2f} | {p99_ratio[-1]:.2f} |"
        )
    medians = {
        "generation_kept": _median(kept_gen),
        "embedding_kept": _median(kept_emb),
        "embedding_p99_ratio": _median(p99_ratio),
    }
    lines.append(
        f"| median | | | | | **{medians['generation_kept']:.2f}** "
        f"| **{medians['embedding_kept']:.2f}** | **{medians['embedding_p99_ratio']:.2f}** |"
    )
    result = {
        "command": "python benchmarks/mixed.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "settings": {
            "streams": args.streams,
            "clients": args.clients,
            "seconds": args.seconds,
            "server_flags": args.server_flag,
        },
        "rounds": rounds,
        "medians": medians,
    }
    return finish(result, "\n".join(lines), args.out)


if __name__ == "__main__":
    sys.exit(main())
