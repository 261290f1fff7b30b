"""A plain Q4_K encoder (gguf's quantiser has none), numpy, for `convert --type Q4_K`.

Block layout (ggml's, 256 values in 144 bytes): float16 ``d``, float16 ``dmin``, 12 bytes holding eight
6-bit sub-block scales and eight 6-bit sub-block mins, 128 bytes of 4-bit codes (byte ``32 i + l`` holds
value ``l`` of sub-block ``2 i`` in its low nibble and of sub-block ``2 i + 1`` in its high nibble).
A value decodes as ``d * scale_j * q - dmin * min_j``.

The encoding is the simple min/max one: per 32-value sub-block, ``min_j = max(0, -min(x))`` and
``scale_j = (max(x) + min_j) / 15``; ``d`` and ``dmin`` are the largest of those / 63 (rounded to float16);
6-bit codes and 4-bit codes are rounded to nearest. llama.cpp's encoder searches scales to lower the error
further; files written here decode with every Q4_K reader, at a somewhat higher quantisation error.
"""

from __future__ import annotations

import numpy as np

from h3director.errors import InvalidInputError

QK_K = 256


def _pack_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins (n, 8) -> the 12 packed bytes (n, 12) ggml's get_scale_min reads."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    a = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    b = (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6)
    c = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return np.concatenate([a, b, c], axis=1)


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """float32 (..., k) with k a multiple of 256 -> uint8 (..., k / 256 * 144) Q4_K blocks."""
    values = np.asarray(values, dtype=np.float32)
    if values.ndim == 0 or values.shape[-1] % QK_K:
        raise InvalidInputError(f"Q4_K needs rows of whole {QK_K}-value blocks, got shape {list(values.shape)}")
    lead = values.shape[:-1]
    x = values.reshape(-1, 8, 32)
    n = x.shape[0]
    with np.errstate(all="ignore"):
        mins = np.maximum(0.0, -x.min(axis=2)).astype(np.float32)           # (n, 8), >= 0
        scales = ((x.max(axis=2) + mins) / np.float32(15)).astype(np.float32)
        d = (scales.max(axis=1) / np.float32(63)).astype(np.float16)        # (n,)
        dmin = (mins.max(axis=1) / np.float32(63)).astype(np.float16)
        d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
        sc = np.where(d32 > 0, np.rint(scales / d32), 0).clip(0, 63)
        mn = np.where(dmin32 > 0, np.rint(mins / dmin32), 0).clip(0, 63)
        step = (d32 * sc.astype(np.float32))[:, :, None]
        offset = (dmin32 * mn.astype(np.float32))[:, :, None]
        q = np.where(step > 0, np.rint((x + offset) / step), 0)
    q = np.nan_to_num(q, nan=0.0).clip(0, 15).astype(np.uint8).reshape(n, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(n, 128)
    blocks = np.concatenate([d.reshape(n, 1).view(np.uint8), dmin.reshape(n, 1).view(np.uint8),
                             _pack_scales(sc, mn), qs], axis=1)
    return blocks.reshape(*lead, -1)


ENCODERS = {"Q4_K": quantize_q4_k}


def quantize(values: np.ndarray, qtype_name: str) -> np.ndarray:
    """Encode `values` as `qtype_name` (one of `ENCODERS`)."""
    if qtype_name not in ENCODERS:
        raise InvalidInputError(f"no encoder for {qtype_name}; this module writes {', '.join(ENCODERS)}")
    return ENCODERS[qtype_name](values)
