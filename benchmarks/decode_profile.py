"""Where a decode step's time goes: the running batch of ``benchmarks/generation.py``'s model
stepped in this process (no server), 16 rows of 128 new tokens, split into

- **forward**: the model's call on every row's last token, and within it the share of time
  torch's operators run (``torch.profiler``'s self CPU time of the ``aten::`` operators over
  five profiled steps, against those steps' wall time: the kernels; on two threads their CPU
  time can exceed the wall time) against the rest (Python: the modules' calls, mask and cache
  bookkeeping);
- **per row**: picking and recording each row's token (argmax, the detokenised text, stop
  strings), outside the forward;
- **the rest of the step**: the new token ids and attention mask built, the cache's columns.

Each split is measured on one and on two intra-op threads (vLLM's CPU build computes on one
core and leaves the other to its front end), and on each path a step can take (``--paths``):

``--family llama`` steps a Llama of the same width and layers instead (grouped-query
attention, rotary positions, a gated feed-forward).

- **fused**: what the server runs: the fused step (:mod:`batching.models.generation.
  fused_step`) and each row's text decoded a few tokens at a time (:mod:`batching.models.
  generation.detokenizer`);
- **plain**: the fused step with its weight products computed by plain ``addmm``/``linear``
  at every size, none from the oneDNN-prepacked copies (:mod:`batching.models.generation.
  packed_products`; what the fused path uses where the load measured them faster);
- **modules**: transformers' forward computes the step (``BATCHING_FUSED_STEP=0``);
- **whole**: the fused step, each row's new tokens decoded whole at every step.

Then a lone request's prefill (``--joins`` of them on each path, in turn): the join of one
of the benchmark's prompts into an empty running batch, its prefill on the fused path, on
the fused path with plain products, and through transformers' forward.

Runs are interleaved: every path on one thread, then on two, twice. The event loop's share
in a served run is what ``py-spy`` shows of the server's main thread under
``benchmarks/generation.py``'s load (the command is in docs/generation.md).

    python benchmarks/decode_profile.py
    python benchmarks/decode_profile.py --vocab 30522 --steps 100
    python benchmarks/decode_profile.py --family llama

Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from generation import VOCAB, build_model, workload  # noqa: E402

from batching.models.generation import causal_batch, running  # noqa: E402
from batching.models.generation.causal import TextGenerator  # noqa: E402
from batching.models.generation.detokenizer import Detokenizer  # noqa: E402
from batching.models.parameters import TaskItem  # noqa: E402

PATHS = ("fused", "plain", "modules", "whole")


def profile(
    generator: TextGenerator, rows: int, steps: int, threads: int, path: str = "fused"
) -> dict[str, Any]:
    """Milliseconds per step of each part on ``path`` (:data:`PATHS`), medians over
    ``steps`` steps of ``rows`` rows."""
    torch.set_num_threads(threads)
    prompts = [
        generator._prepare(i, TaskItem(r.prompt, (("max_new_tokens", steps + 1),)))
        for i, r in enumerate(workload(rows, steps + 1, steps + 1))
    ]
    forwards: list[float] = []
    advances: list[float] = []
    real_forward = causal_batch.DecodeBatch._forward
    real_advance = running.RunningBatchBase._advance_all

    def forward(self: Any, last: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        out = real_forward(self, last, mask)
        forwards.append(time.perf_counter() - started)
        return out

    def advance(self: Any, rows_: Any, logits: torch.Tensor) -> Any:
        started = time.perf_counter()
        out = real_advance(self, rows_, logits)
        advances.append(time.perf_counter() - started)
        return out

    causal_batch.DecodeBatch._forward = forward  # type: ignore[method-assign]
    running.RunningBatchBase._advance_all = advance  # type: ignore[method-assign]
    stack = ExitStack()
    try:
        batch = generator.direct_batch()
        batch.threads.fixed = True  # the count set here, not the governor's
        if path == "modules":
            batch.fused = None
        elif path == "plain":
            stack.enter_context(plain_products(batch.fused))
        elif path == "whole":
            batch.detokenizer = Detokenizer(generator._tokenizer, whole=True)
        batch.join_many(list(enumerate(prompts)))
        forwards.clear()
        advances.clear()
        totals = []
        kernels = 0.0
        profiled = 0
        for index in range(steps):
            if len(batch.rows) < rows:
                break
            if index == steps // 2:  # a few steps under the profiler, mid-way
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
                    for _ in range(5):
                        batch.step()
                kernels = sum(
                    e.self_cpu_time_total
                    for e in p.key_averages()
                    if e.key.startswith(("aten::", "mkldnn::"))
                )
                profiled = 5
                continue
            started = time.perf_counter()
            batch.step()
            totals.append(time.perf_counter() - started)
        # The profiled steps' forwards are slower under the profiler: the kernels' share of
        # their time is what is carried over to the plain forwards.
        middle = slice(steps // 2, steps // 2 + profiled)
        under_profiler = sum(forwards[middle])
        plain = forwards[: steps // 2] + forwards[steps // 2 + profiled :]
        forward_ms = statistics.median(plain) * 1e3
        share = min(kernels / 1e6 / under_profiler, 1.0) if under_profiler else 0.0
        kernel_ms = forward_ms * share
        step_ms = statistics.median(totals) * 1e3
        advance_ms = statistics.median(advances) * 1e3
    finally:
        stack.close()
        causal_batch.DecodeBatch._forward = real_forward  # type: ignore[method-assign]
        running.RunningBatchBase._advance_all = real_advance  # type: ignore[method-assign]
    return {
        "path": path,
        "threads": threads,
        "step_ms": step_ms,
        "forward_ms": forward_ms,
        "kernels_ms": kernel_ms,
        "forward_python_ms": max(forward_ms - kernel_ms, 0.0),
        "per_row_ms": advance_ms,
        "rest_ms": max(step_ms - forward_ms - advance_ms, 0.0),
        "tokens_per_s": rows / (step_ms / 1e3),
    }


@contextmanager
def plain_products(fused: Any) -> Iterator[None]:
    """``fused``'s weight products plain at every size while inside."""
    products = [product for layer in fused.products for product in layer]
    kept = [product.packed for product in products]
    for product in products:
        product.packed = None
    try:
        yield
    finally:
        for product, packed in zip(products, kept, strict=True):
            product.packed = packed


def lone_prefills(generator: TextGenerator, joins: int) -> dict[str, float]:
    """Milliseconds of a lone request's prefill (its join: tokenised, prefilled, its first
    token picked) on the fused path, on it with plain products and through transformers'
    forward, one after the other on the same running batch (the path changing per join), the
    governor choosing the threads: medians over ``joins`` joins of each, the benchmark's
    prompts."""
    torch.set_num_threads(2)
    batch = generator.decode_batch()
    batch.prefixes = None  # every prompt prefilled whole
    fused = batch.fused
    paths = ("fused", "plain", "modules")
    times: dict[str, list[float]] = {path: [] for path in paths}
    prompts = workload(64, 8, 128)
    for index in range(len(paths) * (joins + 10)):
        path = paths[index % len(paths)]
        batch.fused = None if path == "modules" else fused
        item = TaskItem(prompts[(index // 3) % len(prompts)].prompt, (("max_new_tokens", 64),))
        with plain_products(fused) if path == "plain" else nullcontext():
            started = time.perf_counter()
            batch.join_item(index, item)
            if index >= 30:  # after the first shapes
                times[path].append(time.perf_counter() - started)
        batch.fused = fused
        batch.step()
        batch.leave({index})
    return {f"lone_prefill_{path}_ms": statistics.median(v) * 1e3 for path, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--paths", default=",".join(PATHS), help="of " + ", ".join(PATHS))
    parser.add_argument("--family", default="gpt2", choices=["gpt2", "llama"])
    parser.add_argument(
        "--joins", type=int, default=100, help="lone prefills timed on each path (0: none)"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_model(
            Path(tmp) / "gpt", 512, args.width, args.layers, args.vocab, args.family
        )
        generator = TextGenerator("text-generation", folder)
        generator.load("cpu")
        generator.direct_batch().complete(  # warm-up: first shapes, allocator
            [generator._prepare(0, TaskItem("the cat", (("max_new_tokens", 8),)))]
        )
        # Interleaved: every path on one thread, then on two, twice.
        runs = [
            profile(generator, args.rows, args.steps, threads, path)
            for threads in (1, 2, 1, 2)
            for path in args.paths.split(",")
        ]
        prefills = lone_prefills(generator, args.joins) if args.joins else {}
    keys = [k for k in runs[0] if k not in ("threads", "path")]
    columns = [(path, threads) for path in args.paths.split(",") for threads in (1, 2)]
    medians = {
        column: {
            k: statistics.median(r[k] for r in runs if (r["path"], r["threads"]) == column)
            for k in keys
        }
        for column in columns
    }
    print(
        f"{args.family}, {args.rows} rows, vocabulary {args.vocab}, ms per step (medians of 2 runs)"
    )
    print(f"{'':<20}" + "".join(f"{f'{p} {t}t':>13}" for p, t in columns))
    for key in keys:
        print(f"{key:<20}" + "".join(f"{medians[c][key]:>13.2f}" for c in columns))
    if prefills:
        print(
            f"a lone request's prefill (median of {args.joins} each, interleaved): fused "
            f"{prefills['lone_prefill_fused_ms']:.2f} ms, with plain products "
            f"{prefills['lone_prefill_plain_ms']:.2f} ms, transformers' forward "
            f"{prefills['lone_prefill_modules_ms']:.2f} ms"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"args": vars(args) | {"json": None}, "runs": runs, "prefills": prefills}
        args.json.write_text(json.dumps(document))


if __name__ == "__main__":
    main()
