"""Prompt prefix reuse, measured: time to first token of concurrent streams that share a long
prefix (a system prompt), on one server that keeps its prompts' prefixes and one that does
not (``--prefix-cache-mb 0``), the same model folder, side by side.

Each round builds a fresh prefix of ``--prefix-tokens`` tokens and sends two bursts of
``--concurrency`` streamed OpenAI ``/v1/completions`` requests, each that prefix and a short
suffix of its own, greedy, ``--max-tokens`` new tokens:

- **cold**: the prefix is new to both servers (a burst that shares a prefix computes it once);
- **warm**: the same prefix again, with other suffixes (the cache holds it from the cold
  burst).

The servers take each burst in turn (the first of them alternating by round), ``--rounds``
rounds. Reports time to first token p50/p90 per server and burst, the ratios (without / with
the cache), checks every request's text is the same on both servers (greedy), reads the
cache's metrics, and writes the figures as JSON (``--json``). The model is
``benchmarks/generation.py``'s GPT-2 (random weights, a byte-level tokenizer on its words) with
``--positions`` positions.

    python benchmarks/prefix_reuse.py --rounds 3 --json docs/results/prefix-reuse.json
    python benchmarks/prefix_reuse.py --quick

This is a benchmark: run it on a quiet machine (``--quick`` only checks that it runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._results import finish  # noqa: E402
from benchmarks.generation import (  # noqa: E402
    MODEL,
    ROOT,
    WORDS,
    bounded,
    build_model,
    checkout_server,
)

SERVERS = ("reuse", "no-reuse")


@dataclass
class Answer:
    ttft: float
    text: str


async def stream_text(client: httpx.AsyncClient, url: str, prompt: str, tokens: int) -> Answer:
    """One streamed greedy completion: its time to first token and its whole text."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    ttft, pieces = 0.0, []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk["choices"]:
                ttft = ttft or time.perf_counter() - started
                pieces.append(chunk["choices"][0]["text"])
    return Answer(ttft, "".join(pieces))


async def burst(url: str, prompts: list[str], tokens: int) -> list[Answer]:
    """Every prompt at once, streamed."""
    async with httpx.AsyncClient(timeout=600) as client:
        jobs = [stream_text(client, url, prompt, tokens) for prompt in prompts]
        return list(await bounded(len(jobs), jobs))


def prefix_of(folder: Path, tokens: int, rng: random.Random) -> str:
    """Words whose tokens are exactly ``tokens`` (or the first word past it)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    words: list[str] = []
    while len(tokenizer(" ".join(words))["input_ids"]) < tokens:
        words.append(rng.choice(WORDS))
    return " ".join(words)


def suffixes(count: int, rng: random.Random) -> list[str]:
    """Short distinct suffixes."""
    made: set[str] = set()
    while len(made) < count:
        made.add(" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6))))
    return sorted(made)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def cache_metrics(url: str) -> dict[str, float]:
    """The ``batching_prefix_cache_*`` samples of the model."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = re.findall(rf'^(batching_prefix_cache_\w+){{model="{MODEL}"}} (\S+)$', text, re.M)
    return {name: float(value) for name, value in found}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--positions", type=int, default=1024)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--cache-mb", type=int, default=256, help="the reuse server's size")
    parser.add_argument("--quick", action="store_true", help="a tiny setting: checks it runs")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.concurrency, args.prefix_tokens = 1, 4, 96
        args.positions, args.width, args.layers, args.max_tokens = 256, 32, 2, 4
    rng = random.Random(11)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_model(Path(tmp) / MODEL, args.positions, args.width, args.layers)
        base = ["--model", str(folder), "--task", "text-generation"]
        base += ["--max-batch-size", str(args.concurrency)]
        servers = {
            "reuse": checkout_server(
                ROOT, [*base, "--prefix-cache-mb", str(args.cache_mb)], Path(tmp) / "reuse.log"
            ),
            "no-reuse": checkout_server(
                ROOT, [*base, "--prefix-cache-mb", "0"], Path(tmp) / "plain.log"
            ),
        }
        ttfts: dict[str, dict[str, list[float]]] = {
            name: {"cold": [], "warm": []} for name in SERVERS
        }
        mismatches, compared = 0, 0
        for server in servers.values():
            server.start()
        try:
            for server in servers.values():  # one-time costs: not a first token's
                asyncio.run(burst(server.url, ["warm up the server", "and its loop"], 2))
            for round_ in range(args.rounds):
                prefix = prefix_of(folder, args.prefix_tokens, rng)
                order = SERVERS if round_ % 2 == 0 else SERVERS[::-1]
                for kind in ("cold", "warm"):
                    prompts = [prefix + s for s in suffixes(args.concurrency, rng)]
                    texts: dict[str, list[str]] = {}
                    for name in order:
                        answers = asyncio.run(burst(servers[name].url, prompts, args.max_tokens))
                        ttfts[name][kind] += [answer.ttft for answer in answers]
                        texts[name] = [answer.text for answer in answers]
                    compared += len(prompts)
                    mismatches += sum(
                        a != b for a, b in zip(texts["reuse"], texts["no-reuse"], strict=True)
                    )
            metrics = cache_metrics(servers["reuse"].url)
        finally:
            for server in servers.values():
                server.stop()
    figures: dict[str, Any] = {
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "prefix_tokens": args.prefix_tokens,
        "max_tokens": args.max_tokens,
        "model": {"positions": args.positions, "width": args.width, "layers": args.layers},
        "cache_mb": args.cache_mb,
        "ttft_s": ttfts,
        "texts_compared": compared,
        "texts_different": mismatches,
        "reuse_server_metrics": metrics,
    }
    rows = [f"{'time to first token':<34} {'p50 ms':>9} {'p90 ms':>9}"]
    for kind in ("cold", "warm"):
        for name in SERVERS:
            values = ttfts[name][kind]
            p50, p90 = statistics.median(values), percentile(values, 0.9)
            figures[f"{name}_{kind}_p50_s"], figures[f"{name}_{kind}_p90_s"] = p50, p90
            rows.append(f"{kind + ' burst, ' + name:<34} {p50 * 1000:>9.1f} {p90 * 1000:>9.1f}")
        ratio = figures[f"no-reuse_{kind}_p50_s"] / figures[f"reuse_{kind}_p50_s"]
        figures[f"{kind}_p50_ratio"] = ratio
        rows.append(f"{kind + ' burst, p50 without / with':<34} {ratio:>9.2f}x")
    rows.append(f"texts equal on both servers: {compared - mismatches} of {compared}")
    rows.append(
        f"reuse server: {metrics.get('batching_prefix_cache_hits_total', 0):.0f} hits, "
        f"{metrics.get('batching_prefix_cache_reused_tokens_total', 0):.0f} tokens reused, "
        f"{metrics.get('batching_prefix_cache_bytes', 0) / 2**20:.1f} MiB held"
    )
    finish(figures, "\n".join(rows), args.json)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
