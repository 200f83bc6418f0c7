"""The lengths OpenVINO inputs are padded to (:func:`padded_length`): short sentences keep their
own length, no input computes more than an eighth more than its tokens, and the lengths kept
stay few (each new shape leaves compiled kernels behind)."""

from __future__ import annotations

from batching.models.engines.openvino_engine import EXACT_TOKENS, padded_length


def test_inputs_up_to_sixteen_tokens_keep_their_length() -> None:
    # One-sentence traffic (12 words: 14-18 tokens): padding it to 32 took a third of the
    # server's capacity (docs/benchmarks.md).
    assert [padded_length(n) for n in range(1, EXACT_TOKENS + 1)] == list(
        range(1, EXACT_TOKENS + 1)
    )
    assert [padded_length(n) for n in (17, 18, 19, 33, 65, 129)] == [18, 18, 20, 36, 72, 144]


def test_no_input_pays_more_than_an_eighth_and_the_lengths_kept_are_few() -> None:
    for length in range(1, 4097):
        padded = padded_length(length)
        assert length <= padded <= length * 9 / 8
        assert padded_length(padded) == padded  # a kept length is its own
    assert len({padded_length(n) for n in range(1, 257)}) == 48
    assert len({padded_length(n) for n in range(1, 513)}) == 56


def test_an_input_is_never_padded_past_the_position_table() -> None:
    assert padded_length(510, most=512) == 512
    assert padded_length(509, most=510) == 509  # 512 would overflow: its own length
    assert padded_length(18, most=17) == 18
