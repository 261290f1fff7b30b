"""Random GGUF blocks for the dequantisation benchmarks: random bytes with ordinary float16 scales
(normal, std 0.02) where each type keeps its scales, as real files hold; optionally one block per given
float16 bit pattern in the first scale (extreme scales: inf, NaN, subnormal, largest)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np


def random_blocks(name: str, values: int, rng: np.random.Generator, extremes: Sequence[int] = ()) -> np.ndarray:
    """Flat uint8 bytes of ``values // block_values`` blocks of GGML type `name` (e.g. "Q4_K"), drawn from
    `rng`; block i's first scale is then set to the float16 bits ``extremes[i]``."""
    import gguf

    block_values, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
    n = values // block_values
    data = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    scale_at = {"Q6_K": [208]}.get(name, [0, 2] if name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else [0])
    for off in scale_at:
        data[:, off:off + 2] = rng.normal(0, 0.02, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    for i, bits in enumerate(extremes):
        data[i, scale_at[0]:scale_at[0] + 2] = np.frombuffer(struct.pack("<H", bits), np.uint8)
    return data.reshape(-1)
