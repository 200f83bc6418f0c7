"""The fused decode step computes GPT-2's logits as transformers' forward does, step after
step of a running batch whose rows join (left-padded) and leave (columns cut); models it
cannot compute exactly keep transformers' forward."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
import transformers

from batching import BatchingConfig, ModelConfig, create_app
from batching.keys import ApiKeys
from batching.models.generation import packed_products
from batching.models.generation.causal import TextGenerator
from batching.models.generation.causal_batch import DecodeBatch, cache_layers
from batching.models.generation.fused_step import FUSED_STEP_VARIABLE, fused_step_of
from batching.models.generation.gpt2_step import GPT2Step
from batching.models.generation.llama_step import LlamaStep
from batching.models.generation.pieces import Joining
from batching.models.generation.prefix_prefill import Prefill, prefix_cache
from tests.support.generators import gpt2_folder, greedy_text
from tests.support.running_batches import item
from tests.support.threaded import serving_in_thread

PROMPTS = ["the cat sat", "a dog", "who eats fish on the mat", "green", "the cat runs fast"]


@pytest.fixture(params=["plain", "prepacked"])
def products(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the steps' weight products are computed (:mod:`.packed_products`): plain at every
    size, or prepacked at every size (the timings say so, not the machine)."""
    faster = request.param == "prepacked"
    monkeypatch.setattr(
        packed_products,
        "_measure",
        lambda product: [(1.0, 2.0) if faster else (2.0, 1.0)] * len(packed_products.ROWS),
    )
    return str(request.param)


def _routes(batch: DecodeBatch, route: str) -> None:
    fused: Any = batch.fused
    for layer in fused.products:
        for product in layer:
            assert (product.packed is not None) == (route == "prepacked")
            assert product.packed is None or product.min_rows == 1


def _generator(root: Path, activation: str = "gelu_new", family: str = "gpt2") -> TextGenerator:
    folder = gpt2_folder(root, positions=64, model_max_length=None)
    if activation != "gelu_new":
        config = transformers.GPT2Config.from_pretrained(folder)
        config.activation_function = activation
        config.save_pretrained(folder)
    if family != "gpt2":
        _llama_family(folder, family)
    model = TextGenerator("text-generation", folder)
    model.load("cpu")
    return model


def _llama_family(folder: Path, family: str) -> None:
    """Replace the folder's GPT-2 with a tiny Llama-family model of the same vocabulary:
    grouped-query attention (4 heads, 2 of keys and values); the Llama with llama3 rotary
    scaling, the Qwen2 with biased projections."""
    vocab = transformers.GPT2Config.from_pretrained(folder).vocab_size
    common: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "initializer_range": 0.3,
    }
    torch.manual_seed(5)
    model: Any
    if family == "llama":
        config = transformers.LlamaConfig(
            **common,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        )
        model = transformers.LlamaForCausalLM(config)
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    for name in ("model.safetensors", "config.json", "generation_config.json"):
        (folder / name).unlink(missing_ok=True)
    model.save_pretrained(folder)


def _both(batch: DecodeBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """This step's logits by transformers' forward and by the fused step, from the same
    cache (each writes the same new column)."""
    assert batch.mask is not None
    last = torch.tensor([[row.new_ids[-1]] for row in batch.rows])
    mask = torch.cat([batch.mask, torch.ones_like(last)], dim=1)
    end, fused = batch.window.end, batch.fused
    batch.fused = None
    reference = batch._forward(last, mask)
    batch.window.end, batch.fused = end, fused
    mine = batch._forward(last, mask)
    batch.window.end = end
    return reference, mine


@pytest.mark.parametrize(
    ("activation", "family", "step"),
    [
        ("gelu_new", "gpt2", GPT2Step),
        ("relu", "gpt2", GPT2Step),
        ("gelu_new", "llama", LlamaStep),
        ("gelu_new", "qwen2", LlamaStep),
    ],
)
def test_each_step_of_a_changing_batch_equals_transformers(
    tmp_path: Path, activation: str, family: str, step: type, products: str
) -> None:
    batch = _generator(tmp_path, activation, family).decode_batch()
    assert isinstance(batch.fused, step)
    _routes(batch, products)
    joins = {0: [0, 1], 3: [2], 5: [3, 4]}
    lengths = {0: 12, 1: 4, 2: 9, 3: 14, 4: 2}
    compared = 0
    for step in range(24):
        if batch.rows:
            reference, mine = _both(batch)
            # The Llama family's sums run in another order than transformers' (grouped-query
            # attention, rotary positions), and so do oneDNN's prepacked products: a few units
            # of fp32 rounding on logits up to 8, within the 1e-4 the log-probabilities are
            # held to. GPT-2's plain products agree to 1e-5.
            exact = family == "gpt2" and products == "plain"
            difference = float((mine - reference).abs().max())
            assert difference < (1e-5 if exact else 1e-4), (step, difference)
            compared += 1
            ended = {piece.key for piece in batch.step() if piece.finish}
            batch.leave(ended)
        for key in joins.get(step, []):
            batch.join_items([Joining(key, item(PROMPTS[key], lengths[key]))])
    assert compared > 15 and not batch.rows


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_a_prefill_after_cached_prefixes_equals_transformers(
    tmp_path: Path, family: str, products: str
) -> None:
    """Three newcomers, left-padded, two of them after prefixes of different lengths found in
    the prefix cache: the fused prefill's logits, and every real column of the keys and
    values it leaves, are transformers' forward's on the same inputs."""
    batch = _generator(tmp_path, family=family).decode_batch()
    fused = batch.fused
    assert fused is not None
    _routes(batch, products)
    batch.prefixes = prefix_cache(1, block=4)
    tokenize = batch.tokenizer
    long = tokenize(" ".join(PROMPTS))["input_ids"]
    batch._run([long[:13]])  # keeps its first three blocks
    prompts = [long[:13] + long[20:24], long[:6], long[4:11]]
    built = [Prefill.of(prompts, batch.pad, batch.prefixes, batch.layers, batch.device)]
    built.append(Prefill.of(prompts, batch.pad, batch.prefixes, batch.layers, batch.device))
    assert built[0].reused == [12, 4, 0] and built[0].past == 12
    mine = fused.prefill(built[0].input_ids, built[0].positions, built[0].mask, built[0].cache)
    reference = built[1]
    with torch.inference_mode():
        theirs = batch.model(
            input_ids=reference.input_ids,
            attention_mask=reference.mask,
            position_ids=reference.positions,
            cache=reference.cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
    tolerance = 1e-5 if family == "gpt2" and products == "plain" else 1e-4
    assert float((mine - theirs).abs().max()) < tolerance
    real = reference.mask.bool()
    for ours, their in zip(
        cache_layers(built[0].cache), cache_layers(reference.cache), strict=True
    ):
        for a, b in ((ours.keys, their.keys), (ours.values, their.values)):
            assert a is not None and b is not None and a.shape == b.shape
            columns = real[:, None, :, None].expand_as(a)
            assert float((a - b)[columns].abs().max()) < tolerance


def test_only_what_it_computes_exactly_is_fused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generator = _generator(tmp_path)
    model: Any = generator._model
    assert isinstance(fused_step_of(model), GPT2Step)
    for change in (
        {"scale_attn_by_inverse_layer_idx": True},
        {"reorder_and_upcast_attn": True},
        {"activation_function": "silu"},
    ):
        original = model.config
        model.config = type(original)(**{**original.to_dict(), **change})
        try:
            assert fused_step_of(model) is None, change
        finally:
            model.config = original
    llama: Any = _generator(tmp_path / "llama", family="llama")._model
    assert isinstance(fused_step_of(llama), LlamaStep)
    llama.config.hidden_act = "gelu"
    assert fused_step_of(llama) is None
    llama.config.hidden_act = "silu"
    assert fused_step_of(llama.to(torch.bfloat16)) is None  # fp32 on the CPU only
    monkeypatch.setenv(FUSED_STEP_VARIABLE, "0")
    assert fused_step_of(model) is None
    assert generator.decode_batch().fused is not None  # decided when it loaded
    assert _generator(tmp_path / "plain").decode_batch().fused is None


def test_the_output_layer_is_the_models_own_module(tmp_path: Path) -> None:
    """A prepacked output layer (pack_output_layer replaces the module's forward) serves the fused
    step's logits too."""
    generator = _generator(tmp_path)
    head: Any = generator._model.get_output_embeddings()
    plain = head.forward
    calls: list[int] = []

    def counted(hidden: torch.Tensor) -> torch.Tensor:
        calls.append(int(hidden.shape[0]))
        out: torch.Tensor = plain(hidden)
        return out

    head.forward = counted
    batch = generator.decode_batch()
    batch.join_items([Joining(0, item(PROMPTS[0], 3)), Joining(1, item(PROMPTS[1], 3))])
    calls.clear()
    batch.step()
    assert calls == [2]


def test_served_beside_each_other_with_a_key_both_families_stream_transformers_tokens(
    tmp_path: Path, products: str
) -> None:
    """A GPT-2 and a Llama served by one server with a key, one pooled ``openai`` client
    streaming from both in turn and at once: every answer is transformers' greedy one, with
    the steps' products plain and prepacked."""

    folders = {"gpt2": gpt2_folder(tmp_path / "g", positions=64, model_max_length=None)}
    folders["llama"] = gpt2_folder(tmp_path / "l", positions=64, model_max_length=None)
    _llama_family(folders["llama"], "llama")
    configs = [
        ModelConfig(
            name=name,
            source=str(folder),
            task="text-generation",
            batching=BatchingConfig(max_batch_size=8),
        )
        for name, folder in folders.items()
    ]
    key = "sk-fused"
    with serving_in_thread(create_app(configs, api_keys=ApiKeys([key])), timeout=120) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)

        def streamed(model: str, prompt: str) -> str:
            stream = client.completions.create(
                model=model, prompt=prompt, max_tokens=8, temperature=0, stream=True
            )
            return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)

        asked = [(model, prompt) for prompt in PROMPTS for model in folders]
        # In turn (each model's batch empties between two requests and keeps its buffers),
        # then all at once.
        answers = [streamed(*pair) for pair in asked[:4]]
        with ThreadPoolExecutor(len(asked)) as pool:
            answers += list(pool.map(lambda pair: streamed(*pair), asked))
        for (model, prompt), answer in zip(asked[:4] + asked, answers, strict=True):
            assert answer == greedy_text(folders[model], prompt, 8), (model, prompt)
