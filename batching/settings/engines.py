"""The engine flags: what runs each model (``--engine``, ``--precision``), where exports and
measurements are kept (``--engine-cache``), filling that cache and exiting (``--prepare``),
and the intra-op threads of each instance (``--torch-threads``): the CPU thread budget."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from batching.model_config import ModelConfig
from batching.models.engines.engine_options import ENGINES, PRECISIONS, default_cache_dir

from .flags import Parser, one_line

__all__ = ["Engines", "Threads", "add_engine_flags", "read_engines", "read_threads"]


@dataclass(frozen=True, slots=True)
class Engines:
    """What every model of the start runs on by default, and whether to only prepare it."""

    engine: str
    precision: str
    engine_cache: str | None
    #: ``--prepare``: fill the engine cache and exit instead of serving.
    prepare: bool


class Threads(TypedDict):
    """Each instance's intra-op threads, and whether each batch's count adapts up to them
    (fields of ServerSettings)."""

    torch_threads: int
    adaptive_threads: bool


def add_engine_flags(parser: Parser) -> None:
    parser.flag(
        "--engine",
        default="auto",
        choices=ENGINES,
        help="what runs the model: auto measures the installed engines at start-up (on the "
        "warm-up batches, at batch 1 and the batch cap) and keeps the fastest that matches "
        "torch fp32; torch, onnxruntime or openvino pins one (custom classes run on their own)",
    )
    parser.flag(
        "--precision",
        default="auto",
        choices=PRECISIONS,
        help="auto takes bf16 only where it is measured faster and its outputs match fp32 "
        "(cosine >= 0.9999, same labels, same top-k); fp32, bf16, or fp16 on a GPU",
    )
    parser.add_argument(
        "--prepare",
        action="store_true",
        help="export, check and time every model's engines into the engine cache, then exit "
        "(0: all prepared): for container images and init containers "
        "(also: batching-server prepare)",
    )
    parser.flag(
        "--engine-cache",
        help="folder for exported engines and start-up measurements (default: "
        f"{default_cache_dir({})}, or under $XDG_CACHE_HOME)",
    )
    parser.flag(
        "--torch-threads",
        default="auto",
        help="intra-op threads per instance; auto shares the cores out among the instances",
    )


def read_engines(args: argparse.Namespace) -> Engines:
    """The engine flags (checked against each model by its configuration)."""
    return Engines(
        engine=str(args.engine),
        precision=str(args.precision),
        engine_cache=args.engine_cache or None,
        prepare=bool(args.prepare),
    )


def read_threads(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    models: Sequence[ModelConfig],
    cores: int,
) -> Threads:
    """``--torch-threads`` for ``models`` on ``cores``; an operator's ``OMP_NUM_THREADS`` in
    ``environ`` stands for it when it is auto.

    :raises BadSetting: a count that is not a number >= 1 (or auto).
    """
    asked = str(args.torch_threads)
    if asked == "auto" and environ.get("OMP_NUM_THREADS", "").isdigit():
        asked = environ["OMP_NUM_THREADS"]  # the operator already chose
    with one_line():
        threads = torch_threads_for(models, cores, asked)
    return Threads(torch_threads=threads, adaptive_threads=asked == "auto")


def torch_threads_for(models: Sequence[ModelConfig], cores: int, asked: str) -> int:
    """Threads per instance: the cores shared out among this process and the process
    instances.

    Each instance runs its own team of intra-op threads; more threads than cores make them
    wait on each other at every barrier (measured here: 10-100x slower, not 2x). The thread
    instances of every model share this process's cores batch by batch
    (:mod:`batching.models.engines.cores`: the threads lent at once never exceed them), so they
    count once; each process instance has a team of its own. By default C cores are divided
    among those N parties, C // N threads each, at least one.
    """
    if asked != "auto":
        try:
            threads = int(asked)
        except ValueError:
            raise ValueError(f"--torch-threads must be a number or auto, not {asked!r}") from None
        if threads < 1:
            raise ValueError("--torch-threads must be >= 1")
        return threads
    on_cpu = [model for model in models if not _on_gpu(model)]
    processes = sum(len(model.devices) for model in on_cpu if model.instance_kind == "process")
    here = any(model.instance_kind != "process" for model in on_cpu)
    return max(1, cores // max(1, processes + here))


def _on_gpu(model: ModelConfig) -> bool:
    return all(device.startswith("cuda") for device in model.devices)
