"""Instruction prompts: a sentence-transformers folder's prompts and default prompt applied as
``SentenceTransformer.encode`` applies them, the ``--default-prompt-name`` and
``--default-prompt`` overrides, and their refusals at start-up (one line, exit 2)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from batching.model_config import ModelConfig
from batching.models.embedding.prompts import PromptConfigError, PromptOptions
from batching.models.embedding.sentence import SentenceEmbedder
from batching.models.items import EMBEDDING_KEY, EmbedItem, TokenizeItem
from batching.settings.cli import parse_settings
from batching.settings.repository import RepositoryError, load_repository
from tests.support.tiny import classifier_folder, masked_folder, sentence_folder

PROMPTS = {"query": "what is ", "passage": "the a "}
TEXTS = [
    "the cat sat on the mat",
    "a dog",
    "red blue green house tree runs fast slow what where who eats fish sleeps the a cat dog",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("prompts")
    return {
        "default": sentence_folder(root, "default", prompts=PROMPTS, default_prompt_name="query"),
        "plain": sentence_folder(root, "plain", prompts=PROMPTS),
        "bare": sentence_folder(root, "bare"),
        "instructor": sentence_folder(
            root, "instructor", prompts=PROMPTS, default_prompt_name="query", include_prompt=False
        ),
        "classifier": classifier_folder(root, "classifier", ["neg", "pos"]),
        "masked": masked_folder(root, "masked"),
    }


@pytest.fixture(scope="module")
def model(folders: dict[str, Path]) -> Iterator[SentenceEmbedder]:
    embedder = SentenceEmbedder(folders["default"])
    embedder.load("cpu")
    yield embedder


@pytest.fixture(scope="module")
def reference(folders: dict[str, Path]) -> SentenceTransformer:
    return SentenceTransformer(str(folders["default"]), device="cpu")


def _stack(outputs: object) -> np.ndarray:
    return np.stack(list(outputs))  # type: ignore[call-overload]


def test_plain_texts_get_the_folders_default_prompt_as_encode_applies_it(
    model: SentenceEmbedder, reference: SentenceTransformer
) -> None:
    expected = reference.encode(TEXTS)
    np.testing.assert_allclose(model.predict(TEXTS), expected, atol=1e-6)
    # Not the same as no prompt at all: the default prompt made a difference.
    assert not np.allclose(expected, reference.encode(TEXTS, prompt=""), atol=1e-3)


@pytest.mark.parametrize("name", ["query", "passage"])
def test_an_item_with_a_prompt_equals_encode_with_its_prompt_name(
    model: SentenceEmbedder, reference: SentenceTransformer, name: str
) -> None:
    outputs = model.predict([EmbedItem(text, prompt=PROMPTS[name]) for text in TEXTS])
    np.testing.assert_allclose(
        _stack(outputs), reference.encode(TEXTS, prompt_name=name), atol=1e-6
    )


def test_an_item_never_gets_the_default_prompt(
    model: SentenceEmbedder, reference: SentenceTransformer
) -> None:
    outputs = model.predict([EmbedItem(text) for text in TEXTS])
    np.testing.assert_allclose(_stack(outputs), reference.encode(TEXTS, prompt=""), atol=1e-6)


def test_mixed_prompts_in_one_batch_each_equal_their_own_encode(
    model: SentenceEmbedder, reference: SentenceTransformer
) -> None:
    items: list[object] = [
        EmbedItem(TEXTS[0], prompt=PROMPTS["passage"]),
        TEXTS[1],
        EmbedItem(TEXTS[2]),
    ]
    outputs = model.predict(items)
    np.testing.assert_allclose(
        outputs[0], reference.encode(TEXTS[0], prompt_name="passage"), atol=1e-6
    )
    np.testing.assert_allclose(outputs[1], reference.encode(TEXTS[1]), atol=1e-6)
    np.testing.assert_allclose(outputs[2], reference.encode(TEXTS[2], prompt=""), atol=1e-6)


def test_include_prompt_false_leaves_the_prompt_out_of_pooling_as_sentence_transformers(
    folders: dict[str, Path],
) -> None:
    embedder = SentenceEmbedder(folders["instructor"])
    embedder.load("cpu")
    reference = SentenceTransformer(str(folders["instructor"]), device="cpu")
    np.testing.assert_allclose(embedder.predict(TEXTS), reference.encode(TEXTS), atol=1e-6)
    outputs = embedder.predict([EmbedItem(text, prompt=PROMPTS["passage"]) for text in TEXTS])
    expected = reference.encode(TEXTS, prompt_name="passage")
    np.testing.assert_allclose(_stack(outputs), expected, atol=1e-6)
    # The folder that includes its prompt pools differently.
    included = SentenceTransformer(str(folders["default"]), device="cpu")
    assert not np.allclose(expected, included.encode(TEXTS, prompt_name="passage"), atol=1e-3)


@pytest.mark.parametrize(
    ("options", "name", "text"),
    [
        (PromptOptions(name="passage"), "passage", PROMPTS["passage"]),
        (PromptOptions(text="cat "), None, "cat "),
        (PromptOptions(text=""), None, ""),
    ],
)
def test_the_overrides_replace_the_folders_default(
    folders: dict[str, Path],
    reference: SentenceTransformer,
    options: PromptOptions,
    name: str | None,
    text: str,
) -> None:
    embedder = SentenceEmbedder(folders["default"], prompt=options)
    embedder.load("cpu")
    np.testing.assert_allclose(
        embedder.predict(TEXTS), reference.encode(TEXTS, prompt=text), atol=1e-6
    )
    described = embedder.metadata()[EMBEDDING_KEY]
    assert described["default_prompt_name"] == name
    assert described["default_prompt"] == text


def test_metadata_describes_the_prompts_and_options(model: SentenceEmbedder) -> None:
    described = model.metadata()[EMBEDDING_KEY]
    assert described["prompts"] == PROMPTS
    assert described["default_prompt_name"] == "query"
    assert described["default_prompt"] == "what is "
    assert described["max_seq_length"] == 16
    assert described["normalized"] is True
    assert described["outputs"] == ["dense", "tokens"]
    assert described["encodings"] == ["float", "int8", "uint8", "binary", "ubinary"]
    assert described["truncation_directions"] == ["right", "left"]
    assert described["tokenize"] is True
    assert described["calibration_texts"] == 128
    low, high = described["quantization_ranges"]
    assert len(low) == len(high) == 32 and all(a < b for a, b in zip(low, high, strict=True))


def test_a_folder_without_prompts_has_none(folders: dict[str, Path]) -> None:
    described = SentenceEmbedder(folders["bare"]).metadata()[EMBEDDING_KEY]
    assert described["prompts"] == {}
    assert described["default_prompt_name"] is None and described["default_prompt"] == ""


def test_the_prompt_counts_in_tokens(model: SentenceEmbedder) -> None:
    # "what is " is two tokens; "the a " two more; [CLS] and [SEP] around.
    assert model.count_tokens("cat") == 5
    assert model.count_tokens(EmbedItem("cat")) == 3
    assert model.count_tokens(EmbedItem("cat", prompt="the a ")) == 5
    assert model.count_tokens(TokenizeItem("cat", prompt="what is ")) == 5
    assert model.token_length("cat " * 30, 100) == 2 + 2 + 30
    assert model.token_length(EmbedItem("cat " * 30, prompt="the a "), 100) == 2 + 2 + 30
    assert model.token_length(EmbedItem("cat " * 30), 10) == 10
    # Capped at max_seq_length for batching.
    assert model.count_tokens("cat " * 30) == 16


# Settings: the flags, their environment twins, the repository keys and the refusals.


def test_flags_set_the_default_prompt(folders: dict[str, Path]) -> None:
    folder = str(folders["default"])
    model = parse_settings(["--model", folder, "--default-prompt-name", "passage"], {}).models[0]
    assert model.prompt_options == PromptOptions(name="passage")
    model = parse_settings(["--model", folder], {"BATCHING_DEFAULT_PROMPT": "cat "}).models[0]
    assert model.prompt_options == PromptOptions(text="cat ")
    assert parse_settings(["--model", folder], {}).models[0].prompt_options is None


def test_the_flag_reaches_the_model(folders: dict[str, Path]) -> None:
    from batching.app import default_model_builder

    model = parse_settings(
        ["--model", str(folders["default"]), "--default-prompt-name", "passage"], {}
    ).models[0]
    built = default_model_builder(model)
    assert isinstance(built, SentenceEmbedder)
    assert built.metadata()[EMBEDDING_KEY]["default_prompt"] == PROMPTS["passage"]


@pytest.mark.parametrize(
    ("folder", "argv", "message"),
    [
        (
            "default",
            ["--default-prompt-name", "document"],
            "--default-prompt-name 'document' is not a prompt of default; known: passage, query",
        ),
        (
            "bare",
            ["--default-prompt-name", "query"],
            "known: none (the folder declares no prompts)",
        ),
        (
            "default",
            ["--default-prompt-name", "query", "--default-prompt", "x"],
            "--default-prompt-name and --default-prompt are mutually exclusive",
        ),
        (
            "classifier",
            ["--task", "text-classification", "--default-prompt", "x"],
            "takes no prompts",
        ),
        (
            # A sparse model reads its folder's prompts but takes no override: refused rather
            # than accepted and not applied.
            "masked",
            ["--task", "sparse-embedding", "--default-prompt", "x"],
            "takes no prompts override",
        ),
    ],
)
def test_a_prompt_setting_that_cannot_apply_stops_the_start_with_one_line(
    folders: dict[str, Path],
    folder: str,
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--model", str(folders[folder]), *argv], {})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "usage" not in err


def test_the_default_model_declares_no_prompts_but_takes_a_literal_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--default-prompt-name", "query"], {})
    assert exited.value.code == 2
    assert "'query' is not a prompt of all-MiniLM-L6-v2; known: none" in capsys.readouterr().err
    model = parse_settings(["--default-prompt", "query: "], {}).models[0]
    assert model.prompt_options == PromptOptions(text="query: ")


def test_a_folder_whose_own_default_names_no_prompt_is_refused(tmp_path: Path) -> None:
    folder = sentence_folder(tmp_path, "broken", prompts=PROMPTS, default_prompt_name="nope")
    with pytest.raises(PromptConfigError, match="default_prompt_name 'nope' is not among"):
        ModelConfig(name="m", source=str(folder))
    # ... unless the operator overrides it.
    config = ModelConfig(name="m", source=str(folder), default_prompt_name="query")
    assert config.prompt_options == PromptOptions(name="query")


def test_the_flags_are_refused_beside_a_repository(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "repo").mkdir()
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--model-repository", str(tmp_path / "repo"), "--default-prompt", "x"], {})
    assert exited.value.code == 2
    assert "set default_prompt_name or default_prompt in each" in capsys.readouterr().err


def test_repository_keys_set_the_default_prompt(folders: dict[str, Path], tmp_path: Path) -> None:
    source = folders["default"]
    path = tmp_path / "models.toml"
    path.write_text(
        f'[models.a]\nsource = "{source}"\ndefault_prompt_name = "passage"\n'
        f'[models.b]\nsource = "{source}"\ndefault_prompt = ""\n'
        f'[models.c]\nsource = "{source}"\n'
    )
    a, b, c = load_repository(str(path))
    assert a.prompt_options == PromptOptions(name="passage")
    assert b.prompt_options == PromptOptions(text="")
    assert c.prompt_options is None
    path.write_text(f'[models.a]\nsource = "{source}"\ndefault_prompt_name = "document"\n')
    with pytest.raises(RepositoryError, match="known: passage, query"):
        load_repository(str(path))
    path.write_text(f'[models.a]\nsource = "{source}"\ndefault_prompt = 3\n')
    with pytest.raises(RepositoryError, match="default_prompt"):
        load_repository(str(path))
