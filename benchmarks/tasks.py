"""One task family served against the same model called directly: what serving costs and what
dynamic batching buys, per family (token classification, zero-shot, generation, image).

Starts ``python server.py --model FOLDER --task TASK`` (torch, fp32, as the direct call runs
unless flags after ``--`` say otherwise), then runs a closed loop of one-input requests at each
client count (default 1 and 16) for ``--seconds``; then, in this process, calls
``transformers.pipeline(TASK)`` on the same folder at batch 1 and at batch 16, back to back for
as long. Prints one table (items/s, p50 and p99 per request or per call) and writes every
figure as JSON (``--json``, default ``load_test_results/tasks-<family>.json``).

Without ``--model``, the family's tiny model is built from a config in a temporary folder (a
BERT token classifier, a BERT NLI classifier, a GPT-2 without a pad token, a ViT), which
measures the server's overhead rather than a model's compute: give a real folder for figures
that mean a real model.

    python benchmarks/tasks.py --family token-classification
    python benchmarks/tasks.py --family zero-shot --model ./my-nli --seconds 20
    python benchmarks/tasks.py --family image --concurrency 1,16 -- --max-batch-size 16

This is a benchmark: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import orjson  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from load_test.client import LoadSpec, Target, run_load  # noqa: E402
from load_test.payloads import Payload, PayloadSet, make_sentence  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402
from load_test.stats import percentile  # noqa: E402

#: The zero-shot family's labels, sent with every request.
LABELS = ["sports", "politics", "cooking", "travel"]
#: New tokens per generation request (greedy), so each request costs the same.
NEW_TOKENS = 8


@dataclass(frozen=True)
class Family:
    """How one family is served, asked and called directly."""

    task: str
    #: The body of one request for one input, and its content type.
    body: Callable[[Any], bytes]
    content_type: str
    #: The direct call's keyword arguments.
    call: dict[str, Any]
    #: Builds the tiny model's folder under a root.
    tiny: Callable[[Path], Path]
    #: Makes ``count`` inputs (texts, or PNG bytes).
    inputs: Callable[[int], list[Any]]


def _json_body(parameters: dict[str, Any]) -> Callable[[Any], bytes]:
    def body(text: Any) -> bytes:
        document: dict[str, Any] = {"inputs": [text]}
        if parameters:
            document["parameters"] = parameters
        return orjson.dumps(document)

    return body


def _texts(count: int) -> list[str]:
    rng = random.Random(7)
    return [make_sentence(rng, 12) for _ in range(count)]


def _images(count: int) -> list[bytes]:
    from PIL import Image

    rng = random.Random(7)
    images = []
    for _ in range(count):
        image = Image.new("RGB", (64, 64), tuple(rng.randrange(256) for _ in range(3)))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        images.append(buffer.getvalue())
    return images


def _bert_config(**extra: Any) -> Any:
    import transformers

    return transformers.BertConfig(
        vocab_size=len(_VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=128,
        **extra,
    )


_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS = "the a of and to in is was for on with as by at from it this that be are".split()
_VOCAB = _SPECIALS + _WORDS


def _bert_tokenizer(folder: Path) -> None:
    import transformers

    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(_VOCAB) + "\n")
    transformers.BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(folder)


def _labelled(labels: list[str]) -> dict[str, Any]:
    return {
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
    }


def tiny_tagger(root: Path) -> Path:
    import transformers

    folder = root / "tagger"
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    transformers.BertForTokenClassification(_bert_config(**_labelled(labels))).save_pretrained(
        folder
    )
    _bert_tokenizer(folder)
    return folder


def tiny_nli(root: Path) -> Path:
    import transformers

    folder = root / "nli"
    labels = ["entailment", "neutral", "contradiction"]
    transformers.BertForSequenceClassification(_bert_config(**_labelled(labels))).save_pretrained(
        folder
    )
    _bert_tokenizer(folder)
    return folder


def tiny_gpt2(root: Path) -> Path:
    """A GPT-2 whose tokenizer has no pad token, as GPT-2's own has none."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = root / "gpt2"
    vocab = {token: i for i, token in enumerate(["<|endoftext|>", "<unk>", *_WORDS])}
    config = transformers.GPT2Config(
        vocab_size=len(vocab),
        n_positions=128,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        model_max_length=128,
    ).save_pretrained(folder)
    return folder


def tiny_vit(root: Path) -> Path:
    import transformers

    folder = root / "vit"
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        **_labelled(["cat", "dog", "bird"]),
    )
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


FAMILIES: dict[str, Family] = {
    "token-classification": Family(
        "token-classification",
        _json_body({"aggregation_strategy": "simple"}),
        "application/json",
        {"aggregation_strategy": "simple"},
        tiny_tagger,
        _texts,
    ),
    "zero-shot": Family(
        "zero-shot-classification",
        _json_body({"candidate_labels": LABELS}),
        "application/json",
        {"candidate_labels": LABELS},
        tiny_nli,
        _texts,
    ),
    "generation": Family(
        "text-generation",
        _json_body({"max_new_tokens": NEW_TOKENS, "do_sample": False}),
        "application/json",
        {"max_new_tokens": NEW_TOKENS, "do_sample": False},
        tiny_gpt2,
        _texts,
    ),
    "image": Family(
        "image-classification",
        lambda image: image,
        "image/png",
        {},
        tiny_vit,
        _images,
    ),
}


def figures(latencies_s: list[float], items: int, wall_s: float) -> dict[str, float]:
    ordered = sorted(1000 * latency for latency in latencies_s)
    return {
        "items_per_s": items / wall_s if wall_s else float("nan"),
        "p50_ms": percentile(ordered, 50) if ordered else float("nan"),
        "p99_ms": percentile(ordered, 99) if ordered else float("nan"),
        "items": float(items),
    }


def served(
    family: Family, folder: Path, levels: list[int], seconds: float, extra: list[str]
) -> dict[int, dict[str, float]]:
    """Items/s and request latency against ``python server.py`` at each client count."""
    log = ROOT / "load_test_results" / f"tasks-{family.task}-server.log"
    args = ["--model", str(folder), "--task", family.task, "--grpc-port", "0"]
    args += ["--engine", "torch", "--precision", "fp32", *extra]
    bodies = tuple(Payload(body=family.body(x), items=1) for x in family.inputs(64))
    payloads = PayloadSet("json", "/", family.content_type, bodies, model_name=folder.name)
    results: dict[int, dict[str, float]] = {}
    with ServerProcess(args, cwd=ROOT, log_path=log) as server:
        target = Target.parse(server.url)
        for level in levels:
            spec = LoadSpec(payloads=payloads, concurrency=level, duration=seconds, validate=False)
            result = asyncio.run(run_load(target, spec, server_pid=server.pid))
            records = result.records
            latencies = [
                done - sent
                for done, sent, status in zip(
                    records.done, records.sent, records.status, strict=True
                )
                if status == 200
            ]
            results[level] = figures(latencies, records.ok, result.wall_s)
            results[level]["errors"] = float(len(records) - records.ok)
    return results


def direct(
    family: Family, folder: Path, sizes: list[int], seconds: float
) -> dict[int, dict[str, float]]:
    """Items/s and call latency of ``transformers.pipeline`` called directly at each batch."""
    import torch
    import transformers

    pipe = transformers.pipeline(family.task, model=str(folder), device="cpu", dtype=torch.float32)
    if pipe.tokenizer is not None and pipe.tokenizer.pad_token is None:
        # Batched generation needs padding: EOS pads, on the left, as the server does.
        pipe.tokenizer.pad_token = pipe.tokenizer.eos_token
        pipe.tokenizer.padding_side = "left"
    samples = family.inputs(64)
    if family.task == "image-classification":
        from PIL import Image

        samples = [Image.open(io.BytesIO(data)).convert("RGB") for data in samples]
    results: dict[int, dict[str, float]] = {}
    for size in sizes:
        batch = [samples[i % len(samples)] for i in range(size)]
        pipe(batch, batch_size=size, **family.call)  # warm
        latencies: list[float] = []
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            begun = time.perf_counter()
            pipe(batch, batch_size=size, **family.call)
            latencies.append(time.perf_counter() - begun)
        results[size] = figures(latencies, size * len(latencies), time.perf_counter() - started)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="token-classification")
    parser.add_argument("--model", type=Path, help="a model folder (default: a tiny one)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument("--concurrency", default="1,16", help="clients, and direct batch sizes")
    parser.add_argument("--json", type=Path, help="where to write every figure")
    parser.add_argument("server_args", nargs="*", help="after --: flags for server.py")
    args = parser.parse_args(argv)
    family = FAMILIES[args.family]
    levels = [int(level) for level in args.concurrency.split(",")]
    out = args.json or ROOT / "load_test_results" / f"tasks-{args.family}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.model.resolve() if args.model else family.tiny(Path(scratch))
        server = served(family, folder, levels, args.seconds, args.server_args)
        called = direct(family, folder, levels, args.seconds)
    print()
    print(f"{args.family} ({family.task}), {'tiny model' if not args.model else folder.name}")
    print("| way | clients or batch | items/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for label, results in (("server", server), ("direct", called)):
        for level, got in results.items():
            print(
                f"| {label} | {level} | {got['items_per_s']:.0f} | {got['p50_ms']:.1f} "
                f"| {got['p99_ms']:.1f} |"
            )
    document = {
        "family": args.family,
        "task": family.task,
        "model": str(args.model) if args.model else "tiny",
        "seconds": args.seconds,
        "server": {str(level): got for level, got in server.items()},
        "direct": {str(size): got for size, got in called.items()},
    }
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
