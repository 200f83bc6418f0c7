"""The model control flags: whether models are loaded, reloaded and unloaded at run time
(``--model-control-mode``) and how often poll mode re-reads the repository
(``--repository-poll-secs``); docs/model-control.md."""

from __future__ import annotations

import argparse

from batching.control import MODES, ControlOptions
from batching.model_config import ModelConfig
from batching.runtime.cpus import InstanceBudget

from .flags import Parser, fail, one_line
from .reloads import apply_overrides, repository_reader

__all__ = ["add_control_flags", "read_control"]


def add_control_flags(parser: Parser) -> None:
    parser.flag(
        "--model-control-mode",
        default="none",
        choices=MODES,
        help="none: the models of the start, for good (load/unload calls answer 400); "
        "explicit: POST /v2/repository/models/NAME/load and .../unload (and gRPC "
        "RepositoryModelLoad/Unload) load, reload and unload models, with an admin key "
        "(--admin-api-key; without one, only a server with no keys at all takes them); poll: "
        "the repository is re-read every --repository-poll-secs and its changes applied "
        "(needs --model-repository)",
    )
    parser.flag(
        "--repository-poll-secs",
        default=15.0,
        help="with --model-control-mode poll, seconds between two reads of the repository",
    )


def read_control(
    args: argparse.Namespace, defaults: ModelConfig, instances: InstanceBudget
) -> ControlOptions:
    """The model control flags, with the repository they re-read (``--model-repository``;
    without one, the model of the flags is reloaded) and the instance budget of the start,
    which every load must fit too.

    :raises BadSetting: poll mode without a repository, or a poll interval that is not > 0.
    """
    mode = str(args.model_control_mode)
    repository = str(args.model_repository) if args.model_repository else None
    if mode == "poll" and repository is None:
        fail("--model-control-mode poll re-reads the model repository: it needs --model-repository")
    with one_line("--repository-poll-secs: "):
        return ControlOptions(
            mode=mode,
            poll_seconds=float(args.repository_poll_secs),
            read_repository=None
            if repository is None
            else repository_reader(repository, defaults, instances),
            apply_overrides=apply_overrides,
            instances=instances,
        )
