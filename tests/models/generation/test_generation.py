"""Generation called on the model object (``predict``: every item joining a running batch at
once): a tiny GPT-2 whose tokenizer has no pad token (text-generation), a tiny T5 naming task
prefixes (summarization, translation) and a tiny BART (text2text-generation). Every answer
equals a direct ``model.generate`` call on that one input, token for token (greedy, fp32),
alone or with others."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import transformers

from batching.errors import PayloadTooLarge, UnprocessableInput
from batching.models.generation.causal import TextGenerator
from batching.models.generation.seq2seq import Seq2SeqGenerator
from batching.models.parameters import InvalidParameter, TaskItem
from batching.models.source import ModelSource
from batching.models.tasks.table import check_defaults
from tests.support.generators import (
    GPT2_POSITIONS,
    SEQ2SEQ_MAX_INPUT,
    bart_folder,
    completion_of,
    direct,
    direct_seq2seq,
    gpt2_folder,
    t5_folder,
)

PROMPTS = [
    "the cat sat on the mat",
    "a dog",
    "where is the red house and who eats fish",
    "i like it",
    "green",
    "the movie was very good and not bad",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("generators")
    return {"gpt2": gpt2_folder(root), "t5": t5_folder(root), "bart": bart_folder(root)}


@pytest.fixture(scope="module")
def gpt2(folders: dict[str, Path]) -> TextGenerator:
    model = ModelSource.parse(str(folders["gpt2"]), "text-generation").build()
    assert isinstance(model, TextGenerator)
    model.load("cpu")
    return model


@pytest.fixture(scope="module")
def reference(folders: dict[str, Path]) -> tuple[Any, Any]:
    """The GPT-2 as transformers loads it, for direct ``generate`` calls."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folders["gpt2"]))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folders["gpt2"])).eval()
    return tokenizer, model


def test_a_tokenizer_without_pad_token_pads_with_eos_and_says_so(
    folders: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    assert transformers.AutoTokenizer.from_pretrained(str(folders["gpt2"])).pad_token is None
    model = TextGenerator("text-generation", folders["gpt2"])
    with caplog.at_level(logging.INFO, logger="batching"):
        model.load("cpu")
    lines = [r.getMessage() for r in caplog.records if "no pad token" in r.getMessage()]
    assert len(lines) == 1 and "<|endoftext|>" in lines[0]
    assert model.predict(["the cat"])[0]["generated_text"].startswith("the cat")


def test_greedy_answers_equal_direct_generate_alone_and_batched(
    gpt2: TextGenerator, reference: tuple[Any, Any]
) -> None:
    tokenizer = reference[0]
    items = [TaskItem(p, (("max_new_tokens", 8),)) for p in PROMPTS]
    expected = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        new = direct(reference, ids, max_new_tokens=8)
        assert len(new) == 8
        expected.append({"generated_text": prompt + completion_of(reference, ids, new)})
    assert [gpt2.predict([item])[0] for item in items] == expected
    # Left padding: prompts of different lengths in one batch answer as alone.
    assert gpt2.predict(items) == expected


def test_return_full_text_false_is_the_completion_alone(gpt2: TextGenerator) -> None:
    full = gpt2.predict([TaskItem("a dog", (("max_new_tokens", 5),))])[0]["generated_text"]
    alone = gpt2.predict([TaskItem("a dog", (("max_new_tokens", 5), ("return_full_text", False)))])[
        0
    ]["generated_text"]
    assert full == "a dog" + alone and alone


def test_items_with_different_settings_answer_as_alone(gpt2: TextGenerator) -> None:
    items = [
        TaskItem("the cat", (("max_new_tokens", 3),)),
        TaskItem("the cat", (("max_new_tokens", 9),)),
        TaskItem("a dog", (("max_new_tokens", 6), ("repetition_penalty", 1.5))),
        "i like it",
        TaskItem("the cat", (("do_sample", True), ("max_new_tokens", 6), ("seed", 7))),
    ]
    alone = [gpt2.predict([item])[0] for item in items]
    assert gpt2.predict(items) == alone
    assert alone[0] != alone[1] and alone[1]["generated_text"].startswith(
        alone[0]["generated_text"]
    )


def test_a_seed_gives_the_same_text_alone_or_in_any_batch(gpt2: TextGenerator) -> None:
    def sampled(seed: int, prompt: str = "the cat") -> TaskItem:
        params = (("do_sample", True), ("max_new_tokens", 10), ("seed", seed), ("top_k", 50))
        return TaskItem(prompt, tuple(sorted(params)))

    alone = gpt2.predict([sampled(11)])[0]
    batch = [sampled(seed, prompt) for seed in (1, 2, 3) for prompt in PROMPTS[:3]]
    assert gpt2.predict([*batch, sampled(11)])[-1] == alone
    assert gpt2.predict([sampled(11), *batch[:4]])[0] == alone
    texts = {gpt2.predict([sampled(seed)])[0]["generated_text"] for seed in range(6)}
    assert len(texts) > 1  # the seed matters


def test_temperature_zero_is_greedy(gpt2: TextGenerator) -> None:
    greedy = gpt2.predict([TaskItem("a dog", (("max_new_tokens", 6),))])
    for temperature in (0.0, 1e-300):
        cold = gpt2.predict(
            [
                TaskItem(
                    "a dog",
                    (("do_sample", True), ("max_new_tokens", 6), ("temperature", temperature)),
                )
            ]
        )
        assert cold == greedy


def test_the_answer_ends_before_the_first_stop_string(gpt2: TextGenerator) -> None:
    options = (("max_new_tokens", 12), ("return_full_text", False))
    full = gpt2.predict([TaskItem("the cat", options)])[0]["generated_text"]
    at = next(k for k in range(2, len(full) - 1) if full.find(full[k : k + 2]) == k)
    stop = full[at : at + 2]
    cut = gpt2.predict([TaskItem("the cat", (*options, ("stop", (stop, "never seen"))))])
    assert cut == [{"generated_text": full[:at]}]
    # Batched with a row without stop strings, each keeps its own.
    both = gpt2.predict(
        [TaskItem("the cat", options), TaskItem("the cat", (*options, ("stop", (stop,))))]
    )
    assert both == [{"generated_text": full}, {"generated_text": full[:at]}]


def test_a_long_prompt_is_cut_from_the_left_leaving_room_for_new_tokens(
    gpt2: TextGenerator, reference: tuple[Any, Any]
) -> None:
    tokenizer = reference[0]
    prompt = " ".join(["the cat sat on the mat"] * 12)
    ids = tokenizer(prompt)["input_ids"]
    assert len(ids) > GPT2_POSITIONS
    kept = ids[-(GPT2_POSITIONS - 6) :]
    new = direct(reference, kept, max_new_tokens=6)
    answer = gpt2.predict([TaskItem(prompt, (("max_new_tokens", 6), ("return_full_text", False)))])
    assert answer == [{"generated_text": completion_of(reference, kept, new)}]


def test_a_long_prompt_with_truncate_false_is_a_413_naming_the_limit(gpt2: TextGenerator) -> None:
    prompt = " ".join(["the cat sat on the mat"] * 12)
    item = TaskItem(prompt, (("max_new_tokens", 6), ("truncate", False)))
    with pytest.raises(PayloadTooLarge) as refused:
        gpt2.predict(["a dog", item])
    message = str(refused.value)
    assert f"at most {GPT2_POSITIONS - 6}" in message
    limit = f"at most {GPT2_POSITIONS - 6}: its {GPT2_POSITIONS} positions less max_new_tokens 6"
    assert limit in message
    # The same prompt fits when it leaves room enough.
    short = TaskItem("the cat sat", (("max_new_tokens", 6), ("truncate", False)))
    assert gpt2.predict([short])[0]["generated_text"].startswith("the cat sat")


def test_an_empty_prompt_starts_from_the_beginning_of_text(gpt2: TextGenerator) -> None:
    assert gpt2.predict([TaskItem("", (("max_new_tokens", 4),))])[0]["generated_text"]


def test_bad_items_are_client_errors(gpt2: TextGenerator) -> None:
    with pytest.raises(UnprocessableInput, match=r"inputs\[1\]: a generating task takes a text"):
        gpt2.predict(["a dog", 3])
    with pytest.raises(UnprocessableInput, match="'stop' takes at most 16"):
        gpt2.predict([TaskItem("a", (("stop", tuple("abcdefghijklmnopq")),))])


def test_metadata_declares_the_parameters_and_bounds_max_new_tokens(gpt2: TextGenerator) -> None:
    declared = gpt2.metadata()["parameters"]
    assert set(declared) == {
        "max_new_tokens",
        "do_sample",
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "seed",
        "stop",
        "truncate",
        "return_full_text",
        "logprobs",
        "json_schema",
        "regex",
        "grammar",
    }
    assert declared["max_new_tokens"]["maximum"] == GPT2_POSITIONS - 1
    assert declared["max_new_tokens"]["default"] == GPT2_POSITIONS // 2
    assert declared["truncate"]["default"] is True


def test_warm_up_generates_at_batch_one_and_at_the_cap(gpt2: TextGenerator) -> None:
    batches = gpt2.warmup_inputs(4)
    assert [len(batch) for batch in batches] == [1, 4]
    for batch in batches:
        assert len(gpt2.predict(batch)) == len(batch)


# -- encoder-decoders ---------------------------------------------------------------------


def seq2seq(folders: dict[str, Path], folder: str, task: str) -> Seq2SeqGenerator:
    model = ModelSource.parse(str(folders[folder]), task).build()
    assert isinstance(model, Seq2SeqGenerator)
    model.load("cpu")
    return model


def test_summarization_applies_the_task_prefix_and_equals_generate(
    folders: dict[str, Path],
) -> None:
    model = seq2seq(folders, "t5", "summarization")
    # The T5 names max_length 9 for summarization: 8 new tokens after the start token.
    assert model.metadata()["parameters"]["max_new_tokens"]["default"] == 8
    expected = [
        {"summary_text": direct_seq2seq(folders["t5"], "summarize: " + p, max_new_tokens=8)}
        for p in PROMPTS
    ]
    assert [model.predict([p])[0] for p in PROMPTS] == expected
    assert model.predict(PROMPTS) == expected


def test_translation_picks_the_pair_by_task_or_by_request(folders: dict[str, Path]) -> None:
    model = seq2seq(folders, "t5", "translation_en_to_fr")
    declared = model.metadata()["parameters"]
    assert declared["tgt_lang"] == {
        "type": "string",
        "default": "fr",
        "choices": ["de", "fr"],
        "batch_neutral": True,
        "doc": "the language to translate to",
    }
    french = direct_seq2seq(folders["t5"], "translate English to French: the cat", max_new_tokens=5)
    german = direct_seq2seq(folders["t5"], "translate English to German: the cat", max_new_tokens=5)
    assert french != german
    items = [
        TaskItem("the cat", (("max_new_tokens", 5),)),
        TaskItem("the cat", (("max_new_tokens", 5), ("tgt_lang", "de"))),
    ]
    assert model.predict(items) == [{"translation_text": french}, {"translation_text": german}]
    with pytest.raises(UnprocessableInput, match="translates en to de, en to fr, not de to fr"):
        model.predict([TaskItem("the cat", (("src_lang", "de"), ("tgt_lang", "fr")))])


def test_translation_of_a_model_with_several_pairs_needs_a_default(
    folders: dict[str, Path],
) -> None:
    with pytest.raises(ValueError, match="say which is the default with --task translation_"):
        ModelSource.parse(str(folders["t5"]), "translation").build()
    with pytest.raises(ValueError, match="not de to en"):
        ModelSource.parse(str(folders["t5"]), "translation_de_to_en").build()


def test_text2text_batched_equals_generate_and_long_inputs_follow_truncate(
    folders: dict[str, Path],
) -> None:
    model = seq2seq(folders, "bart", "text2text-generation")
    expected = [
        {"generated_text": direct_seq2seq(folders["bart"], p, max_new_tokens=7)} for p in PROMPTS
    ]
    items = [TaskItem(p, (("max_new_tokens", 7),)) for p in PROMPTS]
    assert model.predict(items) == expected
    long = " ".join(PROMPTS * 4)
    cut = model.predict([TaskItem(long, (("max_new_tokens", 7),))])
    assert cut == [{"generated_text": direct_seq2seq(folders["bart"], long, max_new_tokens=7)}]
    with pytest.raises(PayloadTooLarge, match=f"this model takes at most {SEQ2SEQ_MAX_INPUT}"):
        model.predict([TaskItem(long, (("truncate", False),))])
    assert [len(model.predict(batch)) for batch in model.warmup_inputs(3)] == [1, 3]


def test_a_stop_string_ends_its_row_early_and_only_its_row(gpt2: TextGenerator) -> None:
    items = [TaskItem(text, (("max_new_tokens", 12),)) for text in ["the cat", "a dog"]]
    free = [gpt2._prepare(i, entry) for i, entry in enumerate(items)]
    ran = gpt2.decode_batch()
    pieces = ran.join_many(list(enumerate(free)))
    first = pieces[0].text + ran.step()[0].text
    assert first
    stopped = [
        gpt2._prepare(0, TaskItem("the cat", (("max_new_tokens", 12), ("stop", (first,))))),
        free[1],
    ]
    batch = gpt2.decode_batch()
    tokens: dict[int, list[int]] = {0: [], 1: []}
    pieces = batch.join_many(list(enumerate(stopped)))
    while pieces:
        for piece in pieces:
            tokens[piece.key].append(piece.token_id)
        batch.leave({piece.key for piece in pieces if piece.finish is not None})
        pieces = batch.step()
    # Row 0 ends once its text holds the stop string; row 1 runs on, unchanged.
    assert len(tokens[0]) < 12 and len(tokens[1]) == 12
    assert gpt2.predict([items[1]]) == [gpt2.answer(free[1], tokens[1])]


def test_a_tokenizer_with_neither_pad_nor_eos_token_is_refused_at_load(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "no-eos"
    shutil.copytree(folders["gpt2"], folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(eos_token=None, bos_token=None, unk_token=None)
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="neither a pad token nor an end-of-text token"):
        TextGenerator("text-generation", folder).load("cpu")


def test_repository_defaults_are_checked_against_the_generating_tasks() -> None:
    assert check_defaults("translation_en_to_de", {"tgt_lang": "fr", "max_new_tokens": 9}) == (
        ("max_new_tokens", 9),
        ("tgt_lang", "fr"),
    )
    with pytest.raises(InvalidParameter, match="'max_new_tokens' must be >= 1"):
        check_defaults("text-generation", {"max_new_tokens": 0})
    with pytest.raises(InvalidParameter, match="unknown parameter 'return_full_text'"):
        check_defaults("summarization", {"return_full_text": False})


def test_a_repository_default_past_the_models_own_bound_stops_the_start(
    folders: dict[str, Path],
) -> None:
    """``max_new_tokens`` passes the task's check at parse time (>= 1) but is over this
    model's positions: the instance fails to start, naming it, instead of answering every
    request that relies on the default with a 400."""
    from batching.runtime.warmup import WarmupPlan, load_and_warm

    model = ModelSource.parse(str(folders["gpt2"]), "text-generation").build()
    plan = WarmupPlan(parameters=(("max_new_tokens", GPT2_POSITIONS * 10),))
    with pytest.raises(RuntimeError, match="configured parameters do not fit.*max_new_tokens"):
        load_and_warm(model, "cpu", 2, warmup=plan)
    fitting = WarmupPlan(parameters=(("max_new_tokens", 2),))
    assert load_and_warm(model, "cpu", 2, warmup=fitting).warmup_batches >= 1


def test_a_generating_task_takes_either_instance_kind_thread_by_default(
    folders: dict[str, Path],
) -> None:
    """The running batch lives on the instance's thread, or in the instance's own process
    (``tests/runtime/test_process_host.py`` serves it there)."""
    from batching.settings.cli import parse_settings

    argv = ["--model", str(folders["gpt2"]), "--task", "text-generation"]
    assert parse_settings(argv, {}).models[0].instance_kind == "thread"
    chosen = parse_settings([*argv, "--instance-kind", "process"], {})
    assert chosen.models[0].instance_kind == "process"


def test_a_model_whose_cache_cannot_join_a_running_batch_is_refused_at_load(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """Its warm-up runs the decode loop every door runs: a sliding-window cache cannot join
    and be cut, and the model never reports ready, saying why."""
    from batching.runtime.warmup import WarmupPlan, load_and_warm

    folder = tmp_path / "mistral"
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folders["gpt2"]))
    tokenizer.save_pretrained(folder)
    config = transformers.MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=GPT2_POSITIONS,
        sliding_window=4,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    transformers.MistralForCausalLM(config).save_pretrained(folder)
    model = ModelSource.parse(str(folder), "text-generation").build()
    with pytest.raises(RuntimeError, match="DynamicSlidingWindowLayer layers"):
        load_and_warm(model, "cpu", 2, warmup=WarmupPlan())
