"""Prompt prefix reuse in the causal running batch: a tiny GPT-2 with room for long prompts
gives the same greedy tokens (and log-probabilities within 1e-4) whether its prompts' prefixes
come from the cache or not, alone, among newcomers that mix hits, misses and prefixes of
different lengths, and joining a running batch; a prefix newcomers share is computed once;
the cache stays within its bytes; the setting reaches the model, and the metrics show it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from batching import ModelConfig, create_app
from batching.models.generation.causal import TextGenerator
from batching.models.generation.causal_batch import DecodeBatch
from batching.models.generation.pieces import Joining
from batching.models.generation.prefix_prefill import Prefixes, prefix_cache
from batching.models.parameters import TaskItem
from batching.settings.cli import parse_settings
from batching.settings.repository import RepositoryError, load_repository
from tests.support.asgi import serving
from tests.support.generators import causal_reference, direct, gpt2_folder
from tests.support.metrics import sample as metric
from tests.support.running_batches import item, run

#: Positions enough for prompts of a hundred tokens and more.
POSITIONS = 192
#: Tokens per block in the batch-level tests: several blocks in a tiny model's prompts.
BLOCK = 8
SYSTEM = (
    "the cat sat on the mat and the dog eats fish with a red house "
    "i like green trees who runs fast where the blue movie was very good "
)
SUFFIXES = ["a dog", "green fish on the mat", "who", "the cat runs fast on the mat i like"]
#: Prompts sharing the system prefix, one sharing half of it, a short one and one unrelated.
PROMPTS = [
    *(SYSTEM + suffix for suffix in SUFFIXES),
    SYSTEM[:50] + "slow tree",
    "short one",
    "what sleeps is not bad " * 4,
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gpt2_folder(
        tmp_path_factory.mktemp("prefix"), model_max_length=POSITIONS, positions=POSITIONS
    )


@pytest.fixture(scope="module")
def generator(folder: Path) -> TextGenerator:
    model = TextGenerator("text-generation", folder, prefix_cache_mb=0)
    model.load("cpu")
    return model


@pytest.fixture(scope="module")
def expected(folder: Path, generator: TextGenerator) -> list[list[int]]:
    """Each prompt's greedy tokens from transformers' own ``generate``, alone."""
    reference = causal_reference(folder)
    return [
        direct(reference, generator._prepare(0, item(prompt, 10)).ids, max_new_tokens=10)
        for prompt in PROMPTS
    ]


def batch_with(generator: TextGenerator, cache: Prefixes | None) -> DecodeBatch:
    batch = generator.decode_batch()
    batch.prefixes = cache
    return batch


def items() -> list[TaskItem]:
    return [item(prompt, 10) for prompt in PROMPTS]


def primed(generator: TextGenerator) -> tuple[Any, Any, list[tuple[int, TaskItem]], DecodeBatch]:
    """A cache that kept the first prompt only (the others find all of the system prefix,
    part of it: the half-prefix prompt, or nothing: the short and the unrelated prompt), its
    statistics then, the other prompts, and a batch reading that cache."""
    cache = prefix_cache(4, BLOCK)
    run(batch_with(generator, cache), {0: [(0, items()[0])]})
    return cache, cache.stats(), list(enumerate(items()))[1:], batch_with(generator, cache)


def test_greedy_tokens_with_reused_prefixes_are_the_tokens_without(
    generator: TextGenerator, expected: list[list[int]]
) -> None:
    cache = prefix_cache(4, BLOCK)
    entries = list(enumerate(items()))
    # Alone, one after another: the later prompts find what the earlier ones kept.
    alone = {key: run(batch_with(generator, cache), {0: [(key, e)]})[key] for key, e in entries}
    assert [alone[key] for key in range(len(PROMPTS))] == expected
    assert cache.stats().hits >= 4
    # Together, every prefix held; and joining a running batch at different steps.
    together = run(batch_with(generator, cache), {0: entries}, together=True)
    assert [together[key] for key in range(len(PROMPTS))] == expected
    joins = {0: entries[:2], 2: entries[2:5], 3: entries[5:]}
    joined = run(batch_with(generator, cache), joins, together=True)
    assert [joined[key] for key in range(len(PROMPTS))] == expected
    # With the cache off, as before.
    plain = run(batch_with(generator, None), {0: entries}, together=True)
    assert [plain[key] for key in range(len(PROMPTS))] == expected


def test_newcomers_mixing_hits_misses_and_prefix_lengths_get_their_own_tokens(
    generator: TextGenerator, expected: list[list[int]]
) -> None:
    cache, before, mixed, batch = primed(generator)
    seen: list[tuple[int, int]] = []
    original = batch.threads.run

    def counted(governor: Any, rows: int, tokens: int, forward: Any) -> Any:
        seen.append((rows, tokens))
        return original(governor, rows, tokens, forward)

    batch.threads.run = counted  # type: ignore[method-assign]
    tokens = run(batch, {0: mixed}, together=True)
    assert [tokens[key] for key, _ in mixed] == expected[1:]
    after = cache.stats()
    assert after.hits - before.hits == 4  # three full-system prompts and the half one
    assert after.misses - before.misses == 1  # the unrelated one (the short one has no block)
    # The prefill ran fewer tokens than the prompts hold.
    lengths = [len(generator._prepare(0, entry).ids) for _, entry in mixed]
    assert seen[0][0] == len(mixed) and seen[0][1] < len(mixed) * max(lengths)


def test_a_prefix_newcomers_share_is_computed_once(
    generator: TextGenerator, expected: list[list[int]]
) -> None:
    cache = prefix_cache(4, BLOCK)
    shared = list(enumerate(items()))[:4]
    batch = batch_with(generator, cache)
    seen: list[tuple[int, int]] = []
    original = batch.threads.run

    def counted(governor: Any, rows: int, tokens: int, forward: Any) -> Any:
        seen.append((rows, tokens))
        return original(governor, rows, tokens, forward)

    batch.threads.run = counted  # type: ignore[method-assign]
    tokens = run(batch, {0: shared}, together=True)
    assert [tokens[key] for key, _ in shared] == expected[:4]
    ids = [generator._prepare(0, entry).ids for _, entry in shared]
    common = next(i for i in range(len(ids[0])) if len({tuple(p[: i + 1]) for p in ids}) > 1)
    prefix = common // BLOCK * BLOCK
    # First the shared prefix alone, then only the four suffixes.
    assert seen[0] == (1, prefix)
    assert seen[1] == (4, 4 * max(len(p) - prefix for p in ids))
    assert cache.stats().reused_tokens == 4 * prefix


def test_log_probabilities_with_a_reused_prefix_match_within_1e_4(
    generator: TextGenerator,
) -> None:
    def logprobs(cache: Prefixes | None) -> list[torch.Tensor]:
        batch = batch_with(generator, cache)
        steps: list[torch.Tensor] = []
        advance = batch._advance_all

        def record(rows: Any, logits: torch.Tensor) -> Any:
            steps.append(torch.log_softmax(logits.float(), dim=-1))
            return advance(rows, logits)

        batch._advance_all = record  # type: ignore[method-assign]
        run(batch, {0: list(enumerate(items()))}, together=True)
        return steps

    cache = prefix_cache(4, BLOCK)
    run(batch_with(generator, cache), {0: [(0, items()[0])]})
    reused, plain = logprobs(cache), logprobs(None)
    assert cache.stats().reused_tokens > 0
    assert len(reused) == len(plain)
    for with_cache, without in zip(reused, plain, strict=True):
        assert torch.allclose(with_cache, without, atol=1e-4, rtol=0)


def test_a_small_cache_evicts_and_never_holds_more_than_its_bound(
    generator: TextGenerator, expected: list[list[int]]
) -> None:
    cache = prefix_cache(4, BLOCK)
    run(batch_with(generator, cache), {0: [(0, items()[0])]})
    block_bytes = cache.stats().bytes // cache.stats().entries
    # Room for three blocks: every longer prompt evicts.
    cache.capacity = 3 * block_bytes
    cache.clear()
    held: list[int] = []
    for round_ in range(2):
        for key, entry in enumerate(items()):
            batch = batch_with(generator, cache)
            tokens = run(batch, {0: [(key, entry)]})[key]
            assert tokens == expected[key], (round_, key)
            held.append(cache.stats().bytes)
    stats = cache.stats()
    assert max(held) <= cache.capacity and stats.entries <= 3
    assert stats.evictions > 0 and stats.hits > 0


def test_a_disabled_cache_keeps_and_finds_nothing(generator: TextGenerator) -> None:
    cache = prefix_cache(0, BLOCK)
    batch = batch_with(generator, cache)
    batch.join_items([Joining(key, entry) for key, entry in enumerate(items())])
    assert cache.stats().entries == 0 and cache.stats().hits == 0
    assert cache.stats().misses == 0


# -- the setting, the model and the metrics --------------------------------------------------


def test_the_prefix_cache_flag_and_its_twin_reach_the_model_config() -> None:
    assert parse_settings([], {}).models[0].prefix_cache_mb == 256
    assert parse_settings(["--prefix-cache-mb", "0"], {}).models[0].prefix_cache_mb == 0
    environ = {"BATCHING_PREFIX_CACHE_MB": "64"}
    assert parse_settings([], environ).models[0].prefix_cache_mb == 64


def test_a_negative_prefix_cache_size_exits_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--prefix-cache-mb", "-1"], {})
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "prefix_cache_mb must be between 0 and" in error


@pytest.mark.parametrize(("value", "says"), [(0, None), (-1, "prefix_cache_mb: must be")])
def test_a_repository_model_sets_its_prefix_cache_size(
    tmp_path: Path, folder: Path, value: int, says: str | None
) -> None:
    (tmp_path / "gpt").mkdir()
    text = f'source = "{folder}"\ntask = "text-generation"\nprefix_cache_mb = {value}\n'
    (tmp_path / "gpt" / "config.toml").write_text(text, encoding="utf-8")
    if says is None:
        (model,) = load_repository(str(tmp_path))
        assert model.prefix_cache_mb == value
        return
    with pytest.raises(RepositoryError, match=says):
        load_repository(str(tmp_path))


@pytest.mark.anyio
async def test_the_doors_answer_the_same_with_and_without_the_cache_and_metrics_show_it(
    folder: Path,
) -> None:
    configs = [
        ModelConfig(name="kept", source=str(folder), task="text-generation", prefix_cache_mb=1),
        ModelConfig(name="plain", source=str(folder), task="text-generation", prefix_cache_mb=0),
    ]
    async with serving(create_app(configs)) as client:
        texts: dict[str, list[str]] = {"kept": [], "plain": []}
        for model in texts:
            for suffix in SUFFIXES:
                answer = await client.post(
                    "/v1/completions",
                    json={"model": model, "prompt": SYSTEM * 2 + suffix, "max_tokens": 6},
                )
                assert answer.status_code == 200, answer.text
                texts[model].append(answer.json()["choices"][0]["text"])
        assert texts["kept"] == texts["plain"]
        metrics = (await client.get("/metrics")).text

    def sample(name: str, model: str) -> float:
        return metric(metrics, name, model=model)

    assert sample("batching_prefix_cache_capacity_bytes", "kept") == 1 << 20
    assert 0 < sample("batching_prefix_cache_bytes", "kept") <= 1 << 20
    assert sample("batching_prefix_cache_blocks", "kept") >= 3
    assert sample("batching_prefix_cache_hits_total", "kept") == len(SUFFIXES) - 1
    assert sample("batching_prefix_cache_misses_total", "kept") == 1
    assert sample("batching_prefix_cache_reused_tokens_total", "kept") >= 32 * (len(SUFFIXES) - 1)
    assert sample("batching_prefix_cache_capacity_bytes", "plain") == 0
    assert sample("batching_prefix_cache_hits_total", "plain") == 0


def test_a_shared_prefill_that_fails_counts_each_prompts_prefix_once(
    generator: TextGenerator, expected: list[list[int]]
) -> None:
    cache, before, mixed, batch = primed(generator)
    original = batch.threads.run
    failed: list[int] = []

    def fails_once_together(governor: Any, rows: int, tokens: int, forward: Any) -> Any:
        if rows > 1 and not failed:
            failed.append(rows)
            raise RuntimeError("the shared prefill broke")
        return original(governor, rows, tokens, forward)

    batch.threads.run = fails_once_together  # type: ignore[method-assign]
    tokens = run(batch, {0: mixed}, together=True)
    assert failed == [len(mixed)]  # the shared try raised; each prompt then joined alone
    assert [tokens[key] for key, _ in mixed] == expected[1:]
    after = cache.stats()
    # As many finds as when the shared prefill did not fail: counted by the shared try only.
    assert after.hits - before.hits == 4
    assert after.misses - before.misses == 1
