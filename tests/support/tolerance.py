"""What agrees with what, to how much: the numeric contract the tests hold the engines to.

- **Exactly**: what a model decides rather than computes to the last bit (sparse indices,
  labels, the top-k tokens, token ids).
- **rtol 1e-4, atol 1e-5 per value**: torch fp32 (the reference engine) against the library
  that defines the model (sentence-transformers, transformers) on any CPU. The same model in
  another batch, with other padding, or on another instruction set (AVX2, AVX-512, AMX) sums in
  another order: fp32 values move by up to about 1e-5 relative.
- **Cosine 0.9999**: any engine and precision ``--engine auto`` may serve against torch fp32
  (the accuracy check at start-up keeps no variant below it).
"""

from __future__ import annotations

import numpy as np

__all__ = ["ENGINE_COSINE", "TORCH_ATOL", "TORCH_RTOL", "assert_torch_close"]

TORCH_RTOL = 1e-4
TORCH_ATOL = 1e-5
ENGINE_COSINE = 0.9999


def assert_torch_close(got: object, want: object) -> None:
    """torch fp32 values against the reference library's, to the contract's tolerance."""
    np.testing.assert_allclose(
        np.asarray(got, dtype=np.float32),
        np.asarray(want, dtype=np.float32),
        rtol=TORCH_RTOL,
        atol=TORCH_ATOL,
    )
