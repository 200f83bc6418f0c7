"""The task-parameter contract: declarations round-trip through metadata, checks name keys."""

from __future__ import annotations

import pytest

from batching.models.parameters import (
    PARAMETERS_KEY,
    InvalidParameter,
    Param,
    TaskItem,
    check_parameters,
    declared_parameters,
    group_by_parameters,
)

DECLARED = {
    "top_k": Param("top_k", "integer", default=1, minimum=1, batch_neutral=True),
    "candidate_labels": Param("candidate_labels", "strings", required=True),
    "temperature": Param("temperature", "number", minimum=0.0),
    "strategy": Param("strategy", "string", choices=("none", "simple")),
    "multi_label": Param("multi_label", "boolean"),
}


def test_declarations_round_trip_through_metadata() -> None:
    metadata = {PARAMETERS_KEY: {name: p.describe() for name, p in DECLARED.items()}}
    assert declared_parameters(metadata) == DECLARED
    assert declared_parameters({}) == {}


def test_checked_parameters_are_sorted_hashable_and_merged_with_defaults() -> None:
    checked = check_parameters(
        DECLARED, {"candidate_labels": ["a", "b"], "top_k": 2}, defaults={"temperature": 1}
    )
    assert checked == (("candidate_labels", ("a", "b")), ("temperature", 1.0), ("top_k", 2))
    hash(checked)
    assert check_parameters(DECLARED, {"candidate_labels": "a"})[0] == ("candidate_labels", ("a",))


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"candidate_labels": "a", "topk": 1}, "'topk'"),
        ({"candidate_labels": "a", "top_k": "2"}, "'top_k'"),
        ({"candidate_labels": "a", "top_k": True}, "'top_k'"),
        ({"candidate_labels": "a", "top_k": 0}, "'top_k'"),
        ({"candidate_labels": []}, "'candidate_labels'"),
        ({"candidate_labels": "a", "temperature": float("nan")}, "'temperature'"),
        ({"candidate_labels": "a", "strategy": "max"}, "'strategy'"),
        ({"candidate_labels": "a", "multi_label": 1}, "'multi_label'"),
        ({}, "'candidate_labels'"),
    ],
)
def test_bad_parameters_are_refused_by_name(given: dict[str, object], named: str) -> None:
    with pytest.raises(InvalidParameter, match=named):
        check_parameters(DECLARED, given)


def test_items_group_by_what_changes_the_forward_pass() -> None:
    items: list[object] = [
        TaskItem("x", (("temperature", 1.0), ("top_k", 1))),
        TaskItem("y", (("temperature", 1.0), ("top_k", 3))),
        TaskItem("z", (("temperature", 0.5),)),
        "plain",
    ]
    assert group_by_parameters(items, neutral=["top_k"]) == {
        (("temperature", 1.0),): [0, 1],
        (("temperature", 0.5),): [2],
        (): [3],
    }
    assert TaskItem("y", (("top_k", 3),)).get("top_k") == 3
    assert TaskItem("z").get("top_k", 1) == 1
