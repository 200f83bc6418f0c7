"""Greedy picks: each row's first largest value, as torch.argmax picks it (ties, infinities
and NaN included), on contiguous and strided logits."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from batching.models.generation.sampling import first_max

VALUES = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan")]),
    st.floats(width=32, allow_nan=True, allow_infinity=True),
)


@settings(max_examples=300, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 6), st.integers(1, 40)), elements=VALUES))
def test_the_first_largest_value_of_each_row_as_torch_picks_it(values: np.ndarray) -> None:
    logits = torch.from_numpy(values)
    with torch.inference_mode():
        assert first_max(logits) == logits.argmax(dim=-1).tolist()
        strided = logits[:, ::2]
        assert first_max(strided) == strided.argmax(dim=-1).tolist()
        as_bf16 = logits.to(torch.bfloat16)  # not numpy's: torch's own argmax
        assert first_max(as_bf16) == as_bf16.argmax(dim=-1).tolist()
