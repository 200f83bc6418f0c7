"""Streamed generation under load: ``python -m load_test run --api openai-completions`` (or
``openai-chat``, ``v2-generate``) sends streamed requests from N closed-loop clients and
measures what a generating server is judged on:

- **time to first token** (TTFT): from the send to the first event that carries text;
- **inter-token latency** (ITL): between consecutive events that carry text;
- **output tokens/s**: the completion tokens of the answers that ended, over the run's wall
  time (OpenAI: the usage chunk's ``completion_tokens``; ``v2-generate``: its events, one per
  piece of text, which the server sends once per token unless a character or a stop string
  is incomplete);
- the end-to-end latency and the outcomes by status (an error event mid-stream counts as
  ``stream_error``).

The report prints those percentiles; ``result.json`` holds every figure and ``streams.png``
plots TTFT and ITL histograms and output tokens per second over the run.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .stats import percentile

__all__ = ["STREAM_APIS", "StreamSpec", "format_streams", "plot_streams", "run_streams"]

STREAM_APIS = ("openai-completions", "openai-chat", "v2-generate")


@dataclass(frozen=True)
class StreamSpec:
    url: str
    api: str
    model: str
    prompts: list[str]
    max_tokens: tuple[int, int]
    concurrency: int
    requests: int | None
    duration: float | None
    timeout: float = 60.0
    seed: int = 0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Sample:
    started: float
    status: str = "200"
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    total: float = 0.0
    #: When each piece of text arrived (seconds since the run started).
    arrivals: list[float] = field(default_factory=list)


def _request(spec: StreamSpec, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    if spec.api == "v2-generate":
        body = {"text_input": prompt, "parameters": {"max_tokens": max_tokens}}
        return f"/v2/models/{spec.model}/generate_stream", body
    common: dict[str, Any] = {
        "model": spec.model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.api == "openai-chat":
        return "/v1/chat/completions", {
            **common,
            "messages": [{"role": "user", "content": prompt}],
        }
    return "/v1/completions", {**common, "prompt": prompt}


def _text_of(api: str, event: dict[str, Any]) -> str:
    if api == "v2-generate":
        return str(event.get("text_output") or "")
    choices = event.get("choices") or []
    if not choices:
        return ""
    if api == "openai-chat":
        return str((choices[0].get("delta") or {}).get("content") or "")
    return str(choices[0].get("text") or "")


async def _one(
    client: httpx.AsyncClient, spec: StreamSpec, prompt: str, max_tokens: int, origin: float
) -> Sample:
    path, body = _request(spec, prompt, max_tokens)
    started = time.perf_counter()
    sample = Sample(started - origin)
    last = started
    pieces = 0
    try:
        async with client.stream("POST", spec.url.rstrip("/") + path, json=body) as answer:
            if answer.status_code != 200:
                await answer.aread()
                sample.status = str(answer.status_code)
                return sample
            async for line in answer.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    sample.status = "stream_error"
                    return sample
                if event.get("usage"):
                    sample.tokens = int(event["usage"].get("completion_tokens", 0))
                if _text_of(spec.api, event):
                    now = time.perf_counter()
                    if sample.ttft is None:
                        sample.ttft = now - started
                    else:
                        sample.gaps.append(now - last)
                    last = now
                    pieces += 1
                    sample.arrivals.append(now - origin)
    except httpx.TimeoutException:
        sample.status = "timeout"
        return sample
    except httpx.HTTPError:
        sample.status = "connection_error"
        return sample
    finally:
        sample.total = time.perf_counter() - started
    if spec.api == "v2-generate" or not sample.tokens:
        sample.tokens = pieces
    return sample


async def run_streams(spec: StreamSpec) -> dict[str, Any]:
    """Run the load; the result document."""
    rng = random.Random(spec.seed)
    samples: list[Sample] = []
    sent = 0
    origin = time.perf_counter()
    stop_at = origin + spec.duration if spec.duration is not None else None
    limits = httpx.Limits(max_connections=spec.concurrency)
    timeout = httpx.Timeout(spec.timeout)

    async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=spec.headers) as client:

        async def worker() -> None:
            nonlocal sent
            while True:
                if spec.requests is not None and sent >= spec.requests:
                    return
                if stop_at is not None and time.perf_counter() >= stop_at:
                    return
                sent += 1
                prompt = rng.choice(spec.prompts)
                tokens = rng.randint(*spec.max_tokens)
                samples.append(await _one(client, spec, prompt, tokens, origin))

        await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
    wall = time.perf_counter() - origin
    return summarize(spec, samples, wall)


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        f"p{q}_ms": percentile(ordered, q) * 1000 if ordered else float("nan") for q in (50, 90, 99)
    }


def summarize(spec: StreamSpec, samples: list[Sample], wall: float) -> dict[str, Any]:
    ok = [s for s in samples if s.status == "200"]
    tokens = sum(s.tokens for s in ok)
    return {
        "kind": "streams",
        "api": spec.api,
        "model": spec.model,
        "concurrency": spec.concurrency,
        "max_tokens": list(spec.max_tokens),
        "requests": len(samples),
        "ok_requests": len(ok),
        "outcomes": dict(Counter(s.status for s in samples)),
        "wall_s": wall,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "ttft": _ms([s.ttft for s in ok if s.ttft is not None]),
        "itl": _ms([gap for s in ok for gap in s.gaps]),
        "latency": _ms([s.total for s in ok]),
        "samples": [
            {
                "start_s": s.started,
                "status": s.status,
                "ttft_s": s.ttft,
                "total_s": s.total,
                "tokens": s.tokens,
                "arrivals_s": s.arrivals,
            }
            for s in samples
        ],
    }


def format_streams(doc: dict[str, Any]) -> str:
    ttft, itl, latency = doc["ttft"], doc["itl"], doc["latency"]
    return "\n".join(
        [
            f"streams     {doc['api']} -> {doc['model']}, {doc['concurrency']} clients, "
            f"max_tokens {doc['max_tokens'][0]}-{doc['max_tokens'][1]}",
            f"  requests    {doc['requests']} ({doc['ok_requests']} ok; {doc['outcomes']})",
            f"  tokens/s    {doc['output_tokens_per_s']:.1f} output tokens/s "
            f"({doc['output_tokens']} in {doc['wall_s']:.1f} s)",
            f"  TTFT        p50 {ttft['p50_ms']:.1f}  p90 {ttft['p90_ms']:.1f}  "
            f"p99 {ttft['p99_ms']:.1f} ms",
            f"  ITL         p50 {itl['p50_ms']:.1f}  p90 {itl['p90_ms']:.1f}  "
            f"p99 {itl['p99_ms']:.1f} ms",
            f"  latency     p50 {latency['p50_ms']:.1f}  p99 {latency['p99_ms']:.1f} ms",
        ]
    )


def plot_streams(path: Path, doc: dict[str, Any]) -> None:
    """TTFT and ITL histograms, and output tokens per second over the run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = [s for s in doc["samples"] if s["status"] == "200"]
    ttfts = [s["ttft_s"] * 1000 for s in samples if s["ttft_s"] is not None]
    arrivals = sorted(t for s in samples for t in s["arrivals_s"])
    gaps = [b - a for s in samples for a, b in itertools.pairwise(s["arrivals_s"])]
    fig, (first, between, rate) = plt.subplots(1, 3, figsize=(15, 4.3))
    fig.suptitle(
        f"{doc['api']}: {doc['concurrency']} streams, "
        f"{doc['output_tokens_per_s']:.1f} output tokens/s",
        fontsize=11,
    )
    first.hist(ttfts or [0.0], bins=40)
    first.set_xlabel("time to first token (ms)")
    between.hist([g * 1000 for g in gaps] or [0.0], bins=40)
    between.set_xlabel("inter-token latency (ms)")
    seconds = int(doc["wall_s"]) + 1
    counts = [0] * seconds
    for t in arrivals:
        counts[min(int(t), seconds - 1)] += 1
    rate.plot(range(seconds), counts)
    rate.set_xlabel("time (s)")
    rate.set_ylabel("pieces of text per second")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
