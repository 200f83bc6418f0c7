"""Structured outputs in the decode loop (llguidance): a JSON-schema-constrained answer
always parses and validates against its schema (hypothesis-generated schemas of a supported
subset: objects with required properties, arrays, bounded integers and strings, enums,
booleans, null), whatever the tiny random model would rather say; a regex-constrained answer
matches; a tokenizer llguidance cannot read makes a constrained request a 400 naming why."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching.errors import InvalidRequest
from batching.models.generation import constraints
from batching.models.generation.causal import TextGenerator
from batching.models.parameters import TaskItem
from tests.support.generators import gpt2_folder

POSITIONS = 256
NAMES = st.sampled_from(["a", "id", "name", "cat", "on", "x1"])

leaves = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.integers(-50, 50).flatmap(
        lambda low: st.integers(low, low + 100).map(
            lambda high: {"type": "integer", "minimum": low, "maximum": high}
        )
    ),
    st.integers(0, 6).map(lambda most: {"type": "string", "maxLength": most}),
    st.lists(
        st.sampled_from(["red", "green", "blue", "cat"]), min_size=1, max_size=3, unique=True
    ).map(lambda choices: {"enum": choices}),
)


def objects(children: Any) -> Any:
    return st.dictionaries(NAMES, children, min_size=1, max_size=3).map(
        lambda properties: {
            "type": "object",
            "properties": properties,
            "required": sorted(properties),
            "additionalProperties": False,
        }
    )


def arrays(children: Any) -> Any:
    return st.builds(
        lambda items, most: {"type": "array", "items": items, "maxItems": most},
        children,
        st.integers(0, 3),
    )


schemas = st.recursive(leaves, lambda children: objects(children) | arrays(children), max_leaves=5)


@pytest.fixture(scope="module")
def generator(tmp_path_factory: pytest.TempPathFactory) -> TextGenerator:
    folder: Path = gpt2_folder(
        tmp_path_factory.mktemp("structured"), model_max_length=POSITIONS, positions=POSITIONS
    )
    model = TextGenerator("text-generation", folder)
    model.load("cpu")
    return model


def constrained(generator: TextGenerator, prompt: str, **parameters: Any) -> str:
    entry = TaskItem(prompt, tuple(sorted({"max_new_tokens": 200, **parameters}.items())))
    (answer,) = generator.predict([entry])
    return str(answer["generated_text"])[len(prompt) :]


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=objects(schemas) | schemas, prompt=st.sampled_from(["the cat", "a dog", ""]))
def test_a_schema_constrained_answer_always_parses_and_validates(
    generator: TextGenerator, schema: dict[str, Any], prompt: str
) -> None:
    text = constrained(generator, prompt, json_schema=json.dumps(schema))
    jsonschema.validate(json.loads(text), schema)


def test_sampled_rows_keep_to_their_constraint(generator: TextGenerator) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    for seed in range(6):
        text = constrained(
            generator, "the cat", json_schema=json.dumps(schema), do_sample=True, seed=seed
        )
        jsonschema.validate(json.loads(text), schema)
    for seed in range(6):
        text = constrained(
            generator, "a dog", regex="(yes|no) [0-9]{1,3}", do_sample=True, seed=seed
        )
        assert re.fullmatch("(yes|no) [0-9]{1,3}", text), text


def test_a_tokenizer_llguidance_cannot_read_is_a_400_naming_why(
    generator: TextGenerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llguidance.hf

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("no byte-level or byte-fallback vocabulary")

    monkeypatch.setattr(llguidance.hf, "from_tokenizer", unreadable)
    monkeypatch.setattr(constraints, "_TOKENIZERS", constraints.weakref.WeakKeyDictionary())
    with pytest.raises(InvalidRequest, match="byte-level or byte-fallback"):
        constrained(generator, "the cat", regex="[0-9]+")
    monkeypatch.undo()
    assert re.fullmatch(
        "[0-9]+", constrained(generator, "the cat", regex="[0-9]+", max_new_tokens=4)
    )
